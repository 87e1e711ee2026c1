"""`make ladder`: from the naive preset, one technique per rung, each measured against the last.

The rungs are config overrides listed in configs/ladder/ladder.yaml. Each rung is compared with
the rung kept before it in paired, interleaved rounds, every variant in its own process and
stopped while another is measured (isolated.py); both are measured twice per round, alternating,
and the rung before it gives the A/A noise. Its gain is the median of the per-round ratios, and stats.judge calls it
faster, slower or within noise. A `keep: if_faster` rung is kept only when faster beyond the
noise. The cumulative line multiplies only gains beyond the noise (within noise counts x1.00),
and the overall figure is measured, not multiplied: the last kept rung against naive, paired,
at the end. Results: runs/ladder/ladder.json, ladder.md, ladder.png (a waterfall) and
TensorBoard hparams (runs ladder/tb/*), one session per rung.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from train import config as config_lib
from train import scenario as scenario_lib
from train import workloads
from train.benchmarks import isolated, ladder_report, stats, trials
from train.benchmarks.options import LadderOptions
from train.core import files
from train.core.errors import UserError

LADDER_KEYS = {"start", "rungs", "order_check"}
RUNG_KEYS = {"name", "why", "set", "keep", "needs_devices"}


def load_ladder(path: Path) -> dict:
    try:
        ladder = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise UserError(f"Cannot read the ladder {path}: {error}") from None
    if not isinstance(ladder, dict) or "rungs" not in ladder or "start" not in ladder:
        raise UserError(f"{path} must have 'start' (a preset) and 'rungs' (a list).")
    unknown = set(ladder) - LADDER_KEYS
    if unknown:
        raise UserError(
            f"{path}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(LADDER_KEYS))}."
        )
    for index, rung in enumerate(ladder["rungs"]):
        unknown = set(rung) - RUNG_KEYS
        if unknown or "name" not in rung or not isinstance(rung.get("set"), dict):
            raise UserError(
                f"{path}: rung {index + 1} needs 'name' and a 'set' mapping; allowed keys: "
                f"{', '.join(sorted(RUNG_KEYS))}" + (f" (unknown: {', '.join(unknown)})" if unknown else "")
            )
        if rung.get("keep", "always") not in ("always", "if_faster"):
            raise UserError(f"{path}: rung '{rung['name']}' has keep: {rung['keep']!r}; use always or if_faster.")
    names = [rung["name"] for rung in ladder["rungs"]]
    if ladder.get("order_check") is not None and ladder["order_check"] not in names:
        raise UserError(f"{path}: order_check '{ladder['order_check']}' is not a rung; use one of: {', '.join(names)}.")
    return ladder


def default_ladder(scenario: scenario_lib.Scenario, workload: str = workloads.DEFAULT) -> Path:
    """The workload's own ladder (text: configs/ladder/text.yaml) where it has one; else the scenario's own
    ladder (configs/ladder/<scenario>.yaml) where it has one; else configs/ladder/ladder.yaml."""
    own = workloads.get(workload).presets.ladder
    if own:
        return files.PROJECT_ROOT / own
    for overlay in scenario.overlays:
        own = files.PROJECT_ROOT / "configs" / "ladder" / Path(overlay).name
        if own.is_file():
            return own
    return files.PROJECT_ROOT / "configs" / "ladder" / "ladder.yaml"


def overrides(values: dict) -> list[str]:
    return [f"{key}={json.dumps(value) if not isinstance(value, str) else value}" for key, value in values.items()]


def hparams(config: dict) -> dict:
    """The TensorBoard hparams of a resolved config (as config.yaml holds it): the workload's knobs."""
    return workloads.of_record(config).hparams(config)


def paired_round(base, candidate, trials_opts) -> stats.Verdict:
    """Base and candidate, each twice a round (isolated.pair_round): the candidate's verdict against the
    base's A/A noise. Leaves each variant's per-round mean examples/s in its samples."""
    pair = isolated.pair_round(base, candidate, trials_opts.rounds, trials_opts.seconds)
    base.samples[:], candidate.samples[:] = pair.base, pair.candidate
    return stats.judge(pair.ratios, pair.aa_ratios)


def keeps(rule: str, verdict: stats.Verdict) -> bool:
    """`always` rungs are carried forward whatever they measure; `if_faster` ones only when faster beyond the noise."""
    return rule == "always" or verdict.faster


def kept_word(keep: bool, verdict: stats.Verdict) -> str:
    if keep:
        return "yes" if verdict.faster else f"yes ({verdict.word})"
    return f"no ({'slower here' if verdict.slower else verdict.word})"


def measure_rung(index: int, rung: dict, base, candidate_cfg, opts: LadderOptions, out: Path):
    """One rung against the base; returns (its row, the candidate variant)."""
    row = {"rung": index, "name": rung["name"], "why": rung.get("why", ""), "set": rung["set"]}
    row["keep"] = rung.get("keep", "always")
    candidate = isolated.IsolatedVariant(rung["name"], candidate_cfg)
    try:
        verdict = paired_round(base, candidate, opts.trials)
        keep = keeps(row["keep"], verdict)
        profile = candidate.profile(out / "profiles" / f"{index:02d}", num_steps=8)
    except BaseException:
        candidate.close()
        raise
    facts = candidate.facts
    row.update(
        examples_per_sec=candidate.stats(),
        previous_examples_per_sec=base.stats(),
        gain=verdict.gain.median,
        gain_range=[verdict.gain.low, verdict.gain.high],
        verdict=verdict.as_dict(),
        kept=keep,
        kept_text=kept_word(keep, verdict),
        input_bound_percent=profile["input_bound_percent"] if profile else None,
        precision=facts.precision,
        jit_compile=facts.jit_compile,
        steps_per_execution=facts.steps_per_execution,
        batch_size=facts.batch_size,
        strategy=facts.strategy,
        replicas=facts.replicas,
        pipeline=facts.description,
        hparams=hparams(facts.config),
    )
    print(
        f"    {candidate.stats()['median']:,.0f} {facts.unit}, {verdict.line()}: {verdict.word}"
        + ("" if keep else " -> not kept"),
        flush=True,
    )
    return row, candidate


def cumulative(rows: list[dict]) -> float:
    """Each row's product of the kept gains beyond the noise (a gain within noise counts x1.00)."""
    running = 1.0
    for row in rows:
        if row.get("kept") and row["verdict"]["verdict"] != "within noise":
            running *= row["gain"]
        row["cumulative_speedup"] = running
    return running


def climb(ladder: dict, config_for, found, opts: LadderOptions, out: Path) -> dict:
    """Every rung against the rung kept before it, then the last kept rung against naive."""
    rows, kept = [], []
    base = isolated.IsolatedVariant("naive", config_for("naive", []))
    try:
        for index, rung in enumerate(ladder["rungs"], start=1):
            candidate_cfg = config_for(rung["name"], kept + overrides(rung["set"]))
            needs = rung.get("needs_devices", 1)
            device_count = max(len(found.gpus), candidate_cfg.train.cpu_replicas if not found.gpus else 0, 1)
            if device_count < needs:
                skipped = f"needs {needs} devices, this machine has {device_count}"
                rows.append({"rung": index, "name": rung["name"], "why": rung.get("why", ""), "skipped": skipped})
                rows[-1].update(set=rung["set"], keep=rung.get("keep", "always"), kept=False)
                print(f"[{index}] {rung['name']}: skipped ({skipped})", flush=True)
                continue
            print(f"[{index}] {rung['name']}: {rung.get('why', '')}", flush=True)
            row, candidate = measure_rung(index, rung, base, candidate_cfg, opts, out)
            rows.append(row)
            if row["kept"]:
                kept += overrides(rung["set"])
                base.close()
                base = candidate
            else:
                candidate.close()
        return {"rungs": rows, "end_to_end": overall(config_for("naive", []), base, opts)}
    finally:
        base.close()


def main(opts: LadderOptions) -> int:
    workload = config_lib.workload_of(files.project_file(opts.variants.naive))
    scenario = scenario_lib.resolve(opts.variants.scenario, workload)
    ladder_path = files.project_file(opts.ladder or default_ladder(scenario, workload))
    ladder = load_ladder(ladder_path)
    start = ladder_path.parent / ladder["start"]

    def config_for(name: str, kept: list[str]):
        return scenario.load(start, list(opts.variants.overrides) + kept, name=name)

    configs, sets = [config_for("naive", [])], []  # every rung's config is validated before anything runs
    for rung in ladder["rungs"]:
        sets += overrides(rung["set"])
        configs.append(config_for(rung["name"], sets))
    out = Path(opts.out)
    spec, found = trials.begin(scenario, configs, out, clean=True)
    print(
        f"Device: {found.describe()}. Each rung: {opts.trials.rounds} paired rounds of >= {opts.trials.seconds:g} s "
        "against the rung kept before it, both twice a round, alternating (A/A noise), after warm-up; every "
        "variant in its own process, stopped while another is measured.",
        flush=True,
    )
    climbed = climb(ladder, config_for, found, opts, out)
    rows = climbed["rungs"]
    result = {
        "device": found.describe(),
        "scenario": scenario.why,
        "ladder": str(ladder_path),
        "workload": configs[0].workload,
        "unit": workloads.get(configs[0].workload).unit.label,  # of every rate below
        "trials": opts.trials.rounds,
        "trial_seconds": opts.trials.seconds,
        "isolation": "each variant in its own process, stopped (SIGSTOP) while another is measured",
        "naive_examples_per_sec": next((r["previous_examples_per_sec"]["median"] for r in rows if "gain" in r), None),
        "rungs": rows,
        "final_speedup": cumulative(rows),
        "end_to_end": climbed["end_to_end"],
    }
    ladder_report.write(out, result)
    print()
    print(ladder_report.markdown_table(result))
    print(ladder_report.end_to_end_line(result))
    print(f"\nWritten: {out}/ladder.json, ladder.md, ladder.png (TensorBoard: HParams, runs ladder/tb/*)")
    return 0


def overall(naive_cfg, top, opts: LadderOptions) -> dict | None:
    """The last kept rung against naive, measured paired now: the overall figure, with no product of noises."""
    if top.name == "naive":
        return None
    print(f"[end to end] {top.name} (the last kept rung) against naive:", flush=True)
    with isolated.IsolatedVariant("naive", naive_cfg) as naive:
        verdict = paired_round(naive, top, opts.trials)
    print(f"    {verdict.line()}", flush=True)
    return {"against": "naive", "top": top.name, **verdict.as_dict()}
