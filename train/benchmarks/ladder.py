"""`make ladder`: from the naive preset, one technique per rung, each measured against the last.

The rungs are config overrides listed in configs/ladder/ladder.yaml. Each rung is compared with
the rung kept before it in paired, interleaved trials (warm-up excluded); its gain is the
median of the per-round ratios. The input-bound share of each rung comes from a short
profile with step markers. Results: runs/ladder/ladder.json, ladder.md, ladder.png (a
waterfall) and TensorBoard hparams (runs ladder/tb/*), one session per rung.
"""

from __future__ import annotations

import gc
import json
import statistics
from pathlib import Path

import yaml

from train import scenario as scenario_lib
from train.benchmarks import trials
from train.core import files
from train.core.errors import UserError

RUNG_KEYS = {"name", "why", "set", "keep", "needs_devices"}


def load_ladder(path: Path) -> dict:
    try:
        ladder = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise UserError(f"Cannot read the ladder {path}: {error}") from None
    if not isinstance(ladder, dict) or "rungs" not in ladder or "start" not in ladder:
        raise UserError(f"{path} must have 'start' (a preset) and 'rungs' (a list).")
    for index, rung in enumerate(ladder["rungs"]):
        unknown = set(rung) - RUNG_KEYS
        if unknown or "name" not in rung or not isinstance(rung.get("set"), dict):
            raise UserError(
                f"{path}: rung {index + 1} needs 'name' and a 'set' mapping; allowed keys: "
                f"{', '.join(sorted(RUNG_KEYS))}" + (f" (unknown: {', '.join(unknown)})" if unknown else "")
            )
        if rung.get("keep", "always") not in ("always", "if_faster"):
            raise UserError(f"{path}: rung '{rung['name']}' has keep: {rung['keep']!r}; use always or if_faster.")
    return ladder


def default_ladder(scenario: scenario_lib.Scenario) -> Path:
    """The scenario's own ladder (configs/ladder/<scenario>.yaml) where it has one."""
    for overlay in scenario.overlays:
        own = files.PROJECT_ROOT / "configs" / "ladder" / Path(overlay).name
        if own.is_file():
            return own
    return files.PROJECT_ROOT / "configs" / "ladder" / "ladder.yaml"


def _overrides(values: dict) -> list[str]:
    return [f"{key}={json.dumps(value) if not isinstance(value, str) else value}" for key, value in values.items()]


def _hparams(cfg) -> dict:
    p, t = cfg.pipeline, cfg.train
    return {
        "reader": p.reader,
        "parallel_calls": str(p.parallel_calls),
        "cache": p.cache,
        "prefetch": str(p.prefetch),
        "augment": p.augment,
        "batch_size": p.batch_size,
        "precision": str(t.precision),
        "jit_compile": str(t.jit_compile),
        "steps_per_execution": str(t.steps_per_execution),
        "strategy": t.strategy,
    }


def main(args) -> int:
    scenario = scenario_lib.resolve(args.scenario)
    ladder_path = files.project_file(args.ladder or default_ladder(scenario))
    ladder = load_ladder(ladder_path)
    start = ladder_path.parent / ladder["start"]

    def config_for(name: str, kept: list[str]):
        return scenario.load(start, list(args.overrides) + kept, name=name)

    # Every rung's config is validated before anything runs.
    first = config_for("naive", [])
    configs, cumulative = [first], []
    for rung in ladder["rungs"]:
        cumulative += _overrides(rung["set"])
        configs.append(config_for(rung["name"], cumulative))
    out = Path(args.out)
    spec, found = trials.begin(scenario, configs, out, clean=True)
    print(
        f"Device: {found.describe()}. Each rung: {args.trials} paired trials of >= {args.seconds:g} s "
        "against the rung kept before it, after warm-up.",
        flush=True,
    )

    base = trials.prepare("naive", first, spec, found)
    kept: list[str] = []
    rows = []
    for index, rung in enumerate(ladder["rungs"], start=1):
        row = {
            "rung": index,
            "name": rung["name"],
            "why": rung.get("why", ""),
            "set": rung["set"],
            "keep": rung.get("keep", "always"),
        }
        needs = rung.get("needs_devices", 1)
        candidate_cfg = config_for(rung["name"], kept + _overrides(rung["set"]))
        device_count = max(len(found.gpus), candidate_cfg.train.cpu_replicas if not found.gpus else 0, 1)
        if device_count < needs:
            row.update(skipped=f"needs {needs} devices, this machine has {device_count}", kept=False)
            print(f"[{index}] {rung['name']}: skipped ({row['skipped']})", flush=True)
            rows.append(row)
            continue
        print(f"[{index}] {rung['name']}: {row['why']}", flush=True)
        candidate = trials.prepare(rung["name"], candidate_cfg, spec, found)
        base.samples.clear()
        trials.interleaved([base, candidate], args.trials, args.seconds)
        ratios = trials.paired_ratios(candidate, base)
        gain = statistics.median(ratios)
        keep = row["keep"] == "always" or gain > 1.0
        profile = candidate.profile(out / "profiles" / f"{index:02d}", num_steps=8)
        row.update(
            examples_per_sec=candidate.stats(),
            previous_examples_per_sec=base.stats(),
            gain=gain,
            gain_range=[min(ratios), max(ratios)],
            kept=keep,
            input_bound_percent=profile["input_bound_percent"] if profile else None,
            precision=candidate.choices.precision,
            jit_compile=candidate.choices.jit_compile,
            steps_per_execution=candidate.choices.steps_per_execution,
            batch_size=candidate.batch_size,
            strategy=candidate.choices.strategy,
            replicas=candidate.replicas,
            pipeline=candidate.description,
            hparams=_hparams(candidate.cfg),
        )
        print(
            f"    {candidate.stats()['median']:,.0f} examples/s, x{gain:.2f} vs previous "
            f"({row['gain_range'][0]:.2f}-{row['gain_range'][1]:.2f})"
            + ("" if keep else "  -> slower on this device: not kept"),
            flush=True,
        )
        rows.append(row)
        if keep:
            kept += _overrides(rung["set"])
            base = candidate
        del candidate
        gc.collect()

    # Cumulative speedup: the product of the kept rungs' paired gains. Each gain compares two
    # variants measured in the same rounds, so the product is not thrown off by drift between
    # rungs the way a ratio of medians taken minutes apart would be.
    measured = [row for row in rows if "examples_per_sec" in row]
    naive_rate = measured[0]["previous_examples_per_sec"]["median"] if measured else None
    running = 1.0
    for row in rows:
        if row.get("kept"):
            running *= row["gain"]
        row["cumulative_speedup"] = running

    result = {
        "device": found.describe(),
        "scenario": scenario.why,
        "ladder": str(ladder_path),
        "trials": args.trials,
        "trial_seconds": args.seconds,
        "naive_examples_per_sec": naive_rate,
        "rungs": rows,
        "final_speedup": running,
    }
    files.write_json(out / "ladder.json", result)
    files.write_text(out / "ladder.md", markdown(result))
    chart(result, out / "ladder.png")
    write_hparams(out, result)
    print()
    print(markdown_table(result))
    print(f"\nWritten: {out}/ladder.json, ladder.md, ladder.png (TensorBoard: HParams, runs ladder/tb/*)")
    return 0


def markdown_table(result: dict) -> str:
    lines = [
        "| # | rung | examples/s (median, min-max) | gain vs previous | kept | input-bound | cumulative |",
        "|---|---|---:|---:|:---:|---:|---:|",
        f"| 0 | naive | {result['naive_examples_per_sec']:,.0f} | | | | 1.00x |",
    ]
    for row in result["rungs"]:
        if "skipped" in row:
            lines.append(f"| {row['rung']} | {row['name']} | skipped: {row['skipped']} | | | | |")
            continue
        rate = row["examples_per_sec"]
        share = row["input_bound_percent"]
        lines.append(
            f"| {row['rung']} | {row['name']} | {rate['median']:,.0f} ({rate['min']:,.0f}-{rate['max']:,.0f}) | "
            f"x{row['gain']:.2f} | {'yes' if row['kept'] else 'no (slower here)'} | "
            f"{'n/a' if share is None else f'{share:.1f} %'} | {row['cumulative_speedup']:.2f}x |"
        )
    return "\n".join(lines)


def markdown(result: dict) -> str:
    return "\n".join(
        [
            "# Optimization ladder",
            "",
            f"Device: **{result['device']}**. {result['scenario']}. {result['trials']} paired, interleaved trials "
            f"of at least {result['trial_seconds']:g} s per rung against the rung kept before it; warm-up excluded. "
            "*gain* is the median of the per-round ratios against the previous rung; *cumulative* is the product "
            "of the kept gains. Input-bound shares come from a short profile of each rung (with "
            "steps_per_execution > 1 the steps are inferred from the executions: xprof finds no step markers "
            "inside a multi-step execution).",
            "",
            "![waterfall](ladder.png)",
            "",
            markdown_table(result),
            "",
            "Why each rung: " + "; ".join(f"**{r['name']}**: {r['why']}" for r in result["rungs"]) + ".",
            "",
        ]
    )


def chart(result: dict, path: Path) -> None:
    """A waterfall: each rung moves the level by its paired gain; slower rungs not kept are hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    level = result["naive_examples_per_sec"]
    labels, bottoms, heights, colours, hatches, notes, shares = (
        ["naive"],
        [0.0],
        [level],
        ["#7f7f7f"],
        [""],
        [""],
        [None],
    )
    for row in result["rungs"]:
        labels.append(row["name"])
        if "skipped" in row:
            bottoms.append(level), heights.append(0.0), colours.append("#cccccc"), hatches.append("")
            notes.append("skipped"), shares.append(None)
            continue
        reached = level * row["gain"]
        bottoms.append(min(level, reached))
        heights.append(abs(reached - level))
        colours.append("#2ca02c" if reached >= level else "#d62728")
        hatches.append("" if row["kept"] else "//")
        notes.append(f"x{row['gain']:.2f}" + ("" if row["kept"] else " (not kept)"))
        shares.append(row["input_bound_percent"])
        if row["kept"]:
            level = reached
    fig, ax = plt.subplots(figsize=(max(9, 1.05 * len(labels)), 5))
    bars = ax.bar(range(len(labels)), heights, bottom=bottoms, color=colours, edgecolor="black", linewidth=0.5)
    for index, (bar, hatch, note) in enumerate(zip(bars, hatches, notes)):
        bar.set_hatch(hatch)
        if note:
            ax.text(index, bottoms[index] + heights[index], note, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("examples / second (naive median x cumulative gain)")
    ax.set_title(
        f"Optimization ladder - {result['device']} - {result['final_speedup']:.1f}x overall\n"
        "green: faster, red: slower (hatched: slower here, not kept)",
        fontsize=9,
    )
    twin = ax.twinx()
    xs = [i for i, share in enumerate(shares) if share is not None]
    twin.plot(xs, [shares[i] for i in xs], "o--", color="#1f77b4", label="waiting for input (% of step)")
    twin.set_ylim(0, 100)
    twin.set_ylabel("waiting for input, % of step time (profiler)")
    twin.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    files.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)


def write_hparams(out: Path, result: dict) -> None:
    """One TensorBoard session per rung with its knobs as hparams, for the HParams dashboard."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    for row in result["rungs"]:
        if "hparams" not in row:
            continue
        writer = files.scalar_writer(out / "tb" / f"{row['rung']:02d}_{row['name'].replace(' ', '_')}")
        with writer.as_default():
            hp.hparams({**row["hparams"], "rung": row["name"]}, trial_id=f"{row['rung']:02d}")
            tf.summary.scalar("ladder/examples_per_sec", row["examples_per_sec"]["median"], step=row["rung"])
            tf.summary.scalar("ladder/gain_vs_previous", row["gain"], step=row["rung"])
            if row["input_bound_percent"] is not None:
                tf.summary.scalar("ladder/input_bound_percent", row["input_bound_percent"], step=row["rung"])
        writer.close()
