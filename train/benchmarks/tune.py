"""`make tune`: the fastest settings of the speed knobs for your data on your machine.

Starting from a config (the optimized preset by default, plus configs/tuned.yaml when a
previous tune wrote one), a greedy coordinate search tries one knob at a time over a short
list of candidate values, most promising first. Every candidate is measured against the
current best in the same rounds, with the benchmarks' trial discipline (trials.py: warm-up
excluded, one iterator per variant, interleaved rounds, per-round paired ratios), and the
best is measured a second time in each round (A/A), which gives the noise of that very
machine at that very time.

The noise rule: a candidate replaces the best only when

    median of its per-round ratios > 1 + max(MIN_GAIN, noise)   and
    lower quartile of its per-round ratios > 1

where noise is the interquartile range of the best's own A/A ratios (every comparison since
it became the best). A final check measures tuned against start with more rounds under the
same rule; only when it passes is configs/tuned.yaml written: an overlay with the knobs that
changed and a header that says where, on what and by how much.

Only knobs that change speed and not what is learned are searched: parallelism, caching,
prefetch, thread pools, where augmentation runs, DCT-scaled decoding (a slightly different
resize, only where images are stored larger than they are trained), precision, XLA, steps
per execution, and the shuffle buffer down to a floor (see `shuffle_floor`). The batch size
only with --batch, and then the learning rate moves with it (linear scaling rule).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import gc
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import yaml

from train import config as config_lib
from train.core import files
from train.core.errors import UserError

MIN_GAIN = 0.03  # a change must buy at least 3 %, even on a quiet machine
MIN_CALLS = 6  # a trial lasts --seconds and at least this many executions (slow pipelines: longer trials)


# ----------------------------------------------------------------------------------------------
# The rule
# ----------------------------------------------------------------------------------------------


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(lower quartile, median, upper quartile), inclusive method (sensible for 5-9 rounds)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def noise_of(aa_ratios: list[float]) -> float:
    """The spread of A/A ratios (the best against itself): their interquartile range."""
    if len(aa_ratios) < 2:
        return 0.0
    q1, _, q3 = quartiles(aa_ratios)
    return q3 - q1


@dataclasses.dataclass
class Verdict:
    keep: bool
    gain: float  # median of the per-round ratios
    q1: float
    q3: float
    noise: float
    threshold: float

    def line(self) -> str:
        return (
            f"x{self.gain:.3f} (quartiles {self.q1:.3f}-{self.q3:.3f}; A/A noise {self.noise:.3f}, "
            f"needs > {self.threshold:.3f} and lower quartile > 1)"
        )


def judge(ratios: list[float], aa_ratios: list[float], min_gain: float = MIN_GAIN) -> Verdict:
    """Keep only when the median ratio clears 1 + max(min_gain, A/A noise) and the lower quartile clears 1."""
    if not ratios:
        return Verdict(False, float("nan"), float("nan"), float("nan"), noise_of(aa_ratios), float("nan"))
    q1, median, q3 = quartiles(ratios)
    noise = noise_of(aa_ratios)
    threshold = 1.0 + max(min_gain, noise)
    return Verdict(median > threshold and q1 > 1.0, median, q1, q3, noise, threshold)


# ----------------------------------------------------------------------------------------------
# The search space
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Knob:
    key: str  # dotted config key
    values: list  # candidates, most promising first
    why: str = ""
    also: Callable[[Any], dict] | None = None  # keys that move with this one (batch size -> learning rate)

    def apply(self, best: dict, value: Any) -> dict:
        state = {**best, self.key: value}
        if self.also:
            state.update(self.also(value))
        return state


def shuffle_floor(global_batch: int, num_train: int) -> int:
    """The smallest shuffle buffer tune may choose: max(1000, 10 batches), at most the training split.

    A batch is drawn from the buffer only: with a smaller one, neighbouring records (the same
    shard, the order they were written in) land in the same batch and batches stop being a
    fair sample, which changes the gradient noise and so what is learned. Above the floor,
    a smaller buffer only saves memory and the time to refill it at each epoch.
    """
    return min(num_train, max(1000, 10 * global_batch))


def _dedupe(values: list) -> list:
    seen, out = set(), []
    for value in values:
        key = json.dumps(value)
        if key not in seen:
            seen.add(key)
            out.append(value)
    return out


def plan(cfg, spec, found, *, replicas: int = 1, batch: bool = False, only: list[str] = ()) -> list[Knob]:
    """The knobs and their candidates for this config, dataset and machine, in search order.

    `cfg` is the start config as loaded (unresolved). Candidates equal to the current value,
    invalid ones and caches that do not fit are skipped when their turn comes (`vet`).
    """
    p, t = cfg.pipeline, cfg.train
    cores = max(1, found.cpu_cores)
    shards = max(1, len(spec.train_files))
    tfrecord = p.reader == "tfrecord"
    knobs: list[Knob] = []
    if batch:
        base_batch, base_rate = p.batch_size, t.learning_rate
        knobs.append(
            Knob(
                "pipeline.batch_size",
                [value for value in (2 * base_batch, 4 * base_batch, base_batch // 2) if value >= 1],
                "fewer, larger steps; the learning rate is scaled with it (linear scaling rule)",
                also=lambda value: {"train.learning_rate": base_rate * value / base_batch},
            )
        )
    knobs.append(Knob("pipeline.parallel_calls", _dedupe(["auto", cores, 2 * cores]), "decode and augment threads"))
    if tfrecord:
        knobs.append(
            Knob(
                "pipeline.parallel_reads",
                _dedupe(["auto", min(cores, shards), min(2 * cores, shards)]),
                "shards read at once",
            )
        )
    caches = ["memory"] + (["disk"] if p.cache_dir and tfrecord else []) + (["encoded"] if tfrecord else []) + ["none"]
    if p.random_crop:
        caches = [c for c in caches if c in ("encoded", "none")]
    knobs.append(
        Knob("pipeline.cache", caches, f"what is kept between epochs, within cache_limit_mb ({p.cache_limit_mb})")
    )
    knobs.append(Knob("pipeline.prefetch", ["auto", 4], "batches prepared ahead of the model"))
    if p.augment in ("batched", "device", "per_example"):
        order = ["device", "batched", "per_example"] if found.gpus else ["batched", "device", "per_example"]
        knobs.append(Knob("pipeline.augment", order, "where the same flips and shift run"))
    stored = min(spec.image_shape[:2])
    if tfrecord and p.output_size is not None and p.output_size < stored and not p.random_crop:
        knobs.append(
            Knob(
                "pipeline.scaled_decode",
                [not p.scaled_decode],
                "DCT-scaled JPEG decode then resize: pixels differ slightly from a full decode and resize",
            )
        )
    knobs.append(Knob("train.steps_per_execution", [16, 4, 1], "steps per host round trip"))
    if found.gpus:
        tensor_cores = min(found.compute_capabilities) >= (7, 0)
        precisions = (["mixed_float16"] if tensor_cores else []) + ["float32"]
    else:
        # mixed_bfloat16 without bf16 units measured ~7x slower: not worth a trial
        precisions = (["mixed_bfloat16"] if found.cpu_bf16 else []) + ["float32"]
    knobs.append(Knob("train.precision", precisions, "math precision (weights stay float32)"))
    knobs.append(Knob("pipeline.max_intra_op_parallelism", [1, 0], "threads one tf.data op may use"))
    knobs.append(Knob("pipeline.private_threadpool_size", _dedupe([cores, 0]), "tf.data's own thread pool"))
    floor = shuffle_floor(p.batch_size * replicas, spec.num_train)
    shuffles = [value for value in (floor, 2 * floor) if value < p.shuffle_buffer]
    if shuffles:
        knobs.append(Knob("pipeline.shuffle_buffer", shuffles, f"never below {floor} (max(1000, 10 batches))"))
    knobs.append(Knob("train.jit_compile", [True, False], "XLA"))
    if only:
        unknown = set(only) - {k.key for k in knobs}
        if unknown:
            raise UserError(
                f"--only {', '.join(sorted(unknown))}: not a knob tune searches here. "
                f"Searched: {', '.join(k.key for k in knobs)}."
            )
        knobs = [k for k in knobs if k.key in only]
    return knobs


# ----------------------------------------------------------------------------------------------
# The search
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Comparison:
    ratios: list[float]  # candidate / reference, per round
    aa_ratios: list[float]  # reference again / reference, per round (A/A)
    reference_rate: float  # median examples/s
    candidate_rate: float
    extra: dict = dataclasses.field(default_factory=dict)  # name -> per-round ratios candidate / that variant
    samples: dict = dataclasses.field(default_factory=dict)  # name -> examples/s per round


class Measure(Protocol):
    def compare(self, reference: dict, candidate: dict, rounds: int, extra: dict | None = None) -> Comparison: ...

    def keep_only(self, state: dict | None) -> None: ...


@dataclasses.dataclass
class Search:
    start: dict
    best: dict
    trials: list[dict]
    stopped: str  # done | budget | interrupted
    best_rate: float | None = None
    seconds: float = 0.0


def changes(state: dict, start: dict) -> dict:
    return {key: value for key, value in state.items() if start.get(key, _MISSING) != value}


_MISSING = object()


def short(state: dict) -> str:
    return ", ".join(f"{key.split('.')[-1]}={value}" for key, value in state.items()) or "start"


def _candidates(knobs: list[Knob]) -> Iterator[tuple[Knob, Any]]:
    for knob in knobs:
        for value in knob.values:
            yield knob, value


def search(
    start: dict,
    knobs: list[Knob],
    measure: Measure,
    *,
    rounds: int,
    deadline: float,
    first_guess_s: float,
    reserve: Callable[[float], float] = lambda per_trial_s: 0.0,
    vet: Callable[[dict, dict], str | None] | None = None,
    base: dict | None = None,
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] = print,
    progress: bool = True,
) -> Search:
    """Greedy coordinate search: each candidate against the current best, kept by `judge`.

    Stops when every candidate was tried, when the next one would not finish before
    `deadline` (on `clock`) less `reserve(seconds a trial takes)` (the final check, which
    takes as long as some trials), or on Ctrl-C; the best found so far is returned in every case.
    `base` holds the config's own values, for the log. The progress bar shows on a terminal;
    every measured candidate also prints one line with the same progress and estimate.
    """
    from tqdm import tqdm

    began = clock()
    best, aa_pool, rows, durations, beaten = dict(start), [], [], [], []
    best_rate, stopped = None, "done"
    total = sum(len(k.values) for k in knobs)
    bar = tqdm(
        total=total,
        desc="tune",
        unit=" candidates",
        disable=None if progress else True,  # None: only on a terminal
        bar_format="{desc}: {n_fmt}/{total_fmt} candidates |{bar:20}| {elapsed} {postfix}",
    )

    def estimate(done: int) -> str:
        per = statistics.mean(durations) if durations else first_guess_s
        left = min(max(0.0, deadline - reserve(per) - clock()), (total - done) * per)
        rate = f"best {best_rate:,.0f} ex/s, " if best_rate else ""
        return f"{rate}about {left / 60:.1f} min of search left"

    def same(a: dict, b: dict) -> bool:  # a key set to the config's own value is the same as no key
        return changes(a, base or {}) == changes(b, base or {})

    bar.set_postfix_str(estimate(0))
    done = 0
    try:
        for knob, value in _candidates(knobs):
            candidate = knob.apply(best, value)
            row = {
                "trial": len(rows) + 1,
                "knob": knob.key,
                "value": value,
                "from": best.get(knob.key, (base or {}).get(knob.key, "(config)")),
                "candidate": changes(candidate, start),
                "why": knob.why,
            }
            if same(candidate, best):
                reason = "the current value"
            elif any(same(candidate, earlier) for earlier in beaten):
                reason = "an earlier best, already beaten"
            else:
                reason = vet(best, candidate) if vet else None
            if reason is None:
                # The longest trial so far, not the mean: trials that build a cache take twice as long as others.
                longest = max(durations) if durations else first_guess_s
                mean = statistics.mean(durations) if durations else first_guess_s
                if clock() + longest + reserve(mean) > deadline:
                    stopped = "budget"
                    break
                began_trial = clock()
                try:
                    result = measure.compare(best, candidate, rounds)
                except KeyboardInterrupt:
                    raise
                except Exception as error:  # a candidate that cannot run here (XLA, memory): not kept
                    row.update(skipped=f"failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
                    measure.keep_only(best)
                else:
                    verdict = judge(result.ratios, aa_pool + result.aa_ratios)
                    row.update(
                        ratios=result.ratios,
                        aa_ratios=result.aa_ratios,
                        gain=verdict.gain,
                        q1=verdict.q1,
                        q3=verdict.q3,
                        noise=verdict.noise,
                        threshold=verdict.threshold,
                        kept=verdict.keep,
                        best_rate=result.reference_rate,
                        candidate_rate=result.candidate_rate,
                        samples=result.samples,
                    )
                    if verdict.keep:
                        beaten.append(best)
                        best, aa_pool, best_rate = candidate, [], result.candidate_rate
                    else:
                        aa_pool += result.aa_ratios
                        best_rate = result.reference_rate
                    measure.keep_only(best)
                    say(
                        f"[{done + 1}/{total}] {knob.key}: {_fmt(row['from'])} -> {_fmt(value)}: {verdict.line()}: "
                        + ("kept" if verdict.keep else "not kept")
                        + f" ({estimate(done + 1)})"
                    )
                durations.append(clock() - began_trial)
                row["seconds"] = durations[-1]
            else:
                row["skipped"] = reason
            rows.append(row)
            done += 1
            bar.update(1)
            bar.set_postfix_str(estimate(done))
    except KeyboardInterrupt:
        stopped = "interrupted"
        measure.keep_only(best)
        say("Interrupted: the search stops here and keeps the best found so far.")
    finally:
        bar.close()
    return Search(start, best, rows, stopped, best_rate, clock() - began)


# ----------------------------------------------------------------------------------------------
# Search, final check, outputs
# ----------------------------------------------------------------------------------------------


def flatten(values: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in values.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flatten(value, dotted))
        else:
            flat[dotted] = value
    return flat


def nest(flat: dict) -> dict:
    nested: dict = {}
    for key, value in flat.items():
        node = nested
        *sections, leaf = key.split(".")
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return nested


def as_sets(state: dict) -> list[str]:
    """--set strings for a state (values as YAML scalars)."""
    return [f"{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in state.items()]


def overlay(best: dict, base: dict) -> dict:
    """The knobs of `best` whose value differs from the config tune started from (without any
    earlier tuned overlay), nested as a YAML overlay."""
    return nest({key: value for key, value in best.items() if base.get(key, _MISSING) != value})


def read_tuned(path: Path) -> tuple[dict, str]:
    """The knobs of an earlier configs/tuned.yaml (flattened) and its header's first lines."""
    try:
        text = path.read_text()
        values = yaml.safe_load(text) or {}
    except (OSError, yaml.YAMLError) as error:
        raise UserError(f"Cannot read {path} ({error}). Fix or delete it, or pass --fresh.") from None
    if not isinstance(values, dict):
        raise UserError(f"{path} must hold a mapping (an overlay). Fix or delete it, or pass --fresh.")
    header = [line[2:] for line in text.splitlines() if line.startswith("# ")][:4]
    return flatten(values), " / ".join(header)


def run(
    start: dict,
    base: dict,
    knobs: list[Knob],
    measure: Measure,
    *,
    out: Path,
    tuned_path: Path,
    budget_s: float,
    rounds: int,
    final_rounds: int,
    first_guess_s: float,
    final_guess_s: float,
    facts: dict,
    prepare_s: float = 0.0,
    vet: Callable[[dict, dict], str | None] | None = None,
    reference: dict | None = None,
    clock: Callable[[], float] = time.monotonic,
    began: float | None = None,
    say: Callable[[str], None] = print,
    progress: bool = True,
) -> dict:
    """Search, check tuned against start, write runs/tune/ and (when faster) the tuned overlay.

    `start` and `base` are flat {dotted key: value}: `start` the knobs set on top of the
    config at the start (an earlier tuned overlay), `base` every searched key's value in
    the config itself. `reference`: {name: anything measure.compare accepts in `extra`}, measured
    in the final check's rounds too. Returns what tune.json holds.
    """
    began = clock() if began is None else began
    deadline = began + budget_s
    found = search(
        start,
        knobs,
        measure,
        rounds=rounds,
        deadline=deadline,
        first_guess_s=first_guess_s,
        # A search trial measures 3 views for `rounds` rounds; the final check 3 + one per reference for
        # `final_rounds`, after building the start and each reference again: scaled from the trials as
        # measured (a first guess from the warm-up fell 45 s short).
        reserve=lambda per_trial_s: max(
            final_guess_s,
            (1 + len(reference or {})) * prepare_s
            + per_trial_s * final_rounds * (3 + len(reference or {})) / (3 * rounds),
        ),
        vet=vet,
        base=base,
        clock=clock,
        say=say,
        progress=progress,
    )
    result = {
        "rule": (
            f"keep a change when the median of its per-round ratios against the best > 1 + max({MIN_GAIN}, "
            "IQR of the best's A/A ratios) and the lower quartile of its ratios > 1"
        ),
        **facts,
        "budget_minutes": budget_s / 60,
        "rounds": rounds,
        "final_rounds": final_rounds,
        "start": start,
        "best": found.best,
        "stopped": found.stopped,
        "trials": found.trials,
        "search_seconds": found.seconds,
    }
    note, final = None, None
    if found.best == start:
        note = "no candidate was faster than the start beyond the noise: nothing to write"
        measure.keep_only(None)
    else:
        say(f"Final check: tuned ({short(changes(found.best, start))}) against start, {final_rounds} rounds.")
        try:
            comparison = measure.compare(start, found.best, final_rounds, extra=reference)
        except KeyboardInterrupt:
            note = (
                "final check interrupted: written without it; each change passed the noise rule against "
                "the best before it (run make tune again to check)"
            )
        else:
            verdict = judge(comparison.ratios, comparison.aa_ratios)
            final = {
                "ratios": comparison.ratios,
                "aa_ratios": comparison.aa_ratios,
                "gain": verdict.gain,
                "q1": verdict.q1,
                "q3": verdict.q3,
                "min": min(comparison.ratios),
                "max": max(comparison.ratios),
                "noise": verdict.noise,
                "threshold": verdict.threshold,
                "faster": verdict.keep,
                "start_rate": comparison.reference_rate,
                "tuned_rate": comparison.candidate_rate,
                "samples": comparison.samples,
                "against": {
                    name: {"ratios": ratios, "median": statistics.median(ratios)}
                    for name, ratios in comparison.extra.items()
                },
            }
            say(f"  tuned / start: {verdict.line()}: " + ("faster" if verdict.keep else "NOT faster beyond the noise"))
            for name, row in final["against"].items():
                low, high = min(row["ratios"]), max(row["ratios"])
                say(f"  tuned / {name}: x{row['median']:.3f} (per round {low:.3f}-{high:.3f})")
            if not verdict.keep:
                note = "tuned was not faster than start beyond the noise in the final check: nothing written"
        finally:
            measure.keep_only(None)
    result["final"] = final
    interrupted_final = final is None and bool(note) and note.startswith("final check interrupted")
    written = (final is not None and final["faster"]) or interrupted_final
    changed = overlay(found.best, base) if written else None
    result["overlay"] = changed
    result["tuned_path"] = str(tuned_path) if written else None
    if not written and tuned_path.exists():
        note = (note or "") + f"; {tuned_path} left as it was"
    result["note"] = note
    if written:
        files.write_text(tuned_path, tuned_header(result) + yaml.safe_dump(changed, sort_keys=False))
    result["seconds"] = clock() - began
    files.write_json(out / "tune.json", result)
    files.write_text(out / "tune.md", markdown(result))
    chart(result, out / "tune.png")
    return result


def tuned_header(result: dict) -> str:
    final = result["final"]
    lines = [
        f"Written by `make tune` (python -m train tune) on {result.get('date', datetime.date.today().isoformat())}.",
        f"machine: {result.get('machine', '?')}",
        f"dataset: {result.get('dataset', '?')}",
        f"scenario: {result.get('scenario', '?')}",
        f"config: {result.get('config', '?')}",
    ]
    if final:
        lines += [
            f"start {final['start_rate']:,.0f} ex/s, tuned {final['tuned_rate']:,.0f} ex/s (medians of the final "
            f"check, {result['final_rounds']} interleaved rounds)",
            f"gain x{final['gain']:.3f} (median of per-round ratios; quartiles {final['q1']:.3f}-{final['q3']:.3f}, "
            f"min-max {final['min']:.3f}-{final['max']:.3f}; A/A noise {final['noise']:.3f})",
        ]
    else:
        lines.append(result["note"])
    batch = (result["overlay"] or {}).get("pipeline", {}).get("batch_size")
    if batch is not None:
        lines.append(
            f"pipeline.batch_size {batch} with train.learning_rate scaled linearly: this changes what is learned"
        )
    lines += [
        f"Only the knobs that changed. Use: {train_command(result)}",
        "(tuned for the scenario above: under another model or machine, run make tune again).",
    ]
    return "".join(f"# {line}\n" for line in lines)


def train_command(result: dict) -> str:
    """The command that trains with the tuned overlay, under the scenario it was tuned in."""
    layers = [*result.get("scenario_overlays", []), result["tuned_path"]]
    return 'make train-optimized ARGS="' + " ".join(f"--overlay {layer}" for layer in layers) + '"'


def _fmt(value) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def markdown(result: dict) -> str:
    lines = [
        "# make tune",
        "",
        f"Machine: **{result.get('machine', '?')}**. Dataset: {result.get('dataset', '?')}. "
        f"Scenario: {result.get('scenario', '?')}. Config: {result.get('config', '?')}.",
        "",
        f"Each candidate ran against the current best in {result['rounds']} interleaved rounds (warm-up excluded; "
        "the best measured twice per round for its A/A noise). Rule: " + result["rule"] + ".",
        "",
        "![search](tune.png)",
        "",
        "| # | knob | from -> to | ratio vs best (quartiles) | A/A noise | needs | best ex/s | kept |",
        "|---|---|---|---:|---:|---:|---:|:---:|",
    ]
    for row in result["trials"]:
        step = f"{_fmt(row['from'])} -> {_fmt(row['value'])}"
        if "skipped" in row:
            lines.append(f"| {row['trial']} | {row['knob']} | {step} | skipped: {row['skipped']} | | | | |")
            continue
        lines.append(
            f"| {row['trial']} | {row['knob']} | {step} | x{row['gain']:.3f} ({row['q1']:.3f}-{row['q3']:.3f}) | "
            f"{row['noise']:.3f} | > {row['threshold']:.3f} | {row['best_rate']:,.0f} | "
            f"{'**yes**' if row['kept'] else 'no'} |"
        )
    stopped = {
        "done": "every candidate was tried",
        "budget": "the budget ran out",
        "interrupted": "interrupted (Ctrl-C)",
    }
    lines += [
        "",
        f"Search: {stopped.get(result['stopped'], result['stopped'])} after {result['search_seconds']:.0f} s.",
    ]
    final = result["final"]
    if final:
        lines += [
            "",
            f"Final check, tuned against start, {result['final_rounds']} rounds: start {final['start_rate']:,.0f} "
            f"ex/s, tuned {final['tuned_rate']:,.0f} ex/s, **x{final['gain']:.3f}** (quartiles {final['q1']:.3f}-"
            f"{final['q3']:.3f}, min-max {final['min']:.3f}-{final['max']:.3f}; A/A noise {final['noise']:.3f}): "
            + ("faster beyond the noise." if final["faster"] else "not faster beyond the noise."),
        ]
        for name, row in final["against"].items():
            lines.append(f"tuned / {name} in the same rounds: x{row['median']:.3f}.")
    if result["overlay"]:
        lines += [
            "",
            f"Written to `{result['tuned_path']}`:",
            "",
            "```yaml",
            yaml.safe_dump(result["overlay"]).strip(),
            "```",
        ]
    if result["note"]:
        lines += ["", result["note"][0].upper() + result["note"][1:] + "."]
    return "\n".join(lines) + "\n"


def chart(result: dict, path: Path) -> None:
    """Each measured candidate's ratio against the best (median, quartile bar) with the bar it had to
    clear; kept green, not kept grey; the final check in blue. Below: the best's examples/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in result["trials"] if "gain" in row]
    final = result["final"]
    labels = [f"{row['knob'].split('.')[-1]}={_fmt(row['value'])}" for row in rows]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(max(8, 0.55 * (len(rows) + 2)), 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    for index, row in enumerate(rows):
        colour = "#2ca02c" if row["kept"] else "#7f7f7f"
        top.errorbar(
            index,
            row["gain"],
            yerr=[[row["gain"] - row["q1"]], [row["q3"] - row["gain"]]],
            fmt="o",
            color=colour,
            capsize=3,
        )
        top.plot([index - 0.3, index + 0.3], [row["threshold"]] * 2, color="#d62728", linewidth=1)
    if final:
        index = len(rows)
        labels.append("final: tuned / start")
        top.errorbar(
            index,
            final["gain"],
            yerr=[[final["gain"] - final["q1"]], [final["q3"] - final["gain"]]],
            fmt="s",
            color="#1f77b4",
            capsize=3,
        )
        top.plot([index - 0.3, index + 0.3], [final["threshold"]] * 2, color="#d62728", linewidth=1)
    top.axhline(1.0, color="black", linewidth=0.6)
    top.set_ylabel("ratio vs best (median, quartiles)")
    top.set_title(
        f"make tune - {result.get('machine', '')}\n"
        "green: kept, grey: not kept, blue: final check; red tick: the ratio a candidate had to beat",
        fontsize=9,
    )
    rates = [row["candidate_rate"] if row["kept"] else row["best_rate"] for row in rows]
    if final:
        rates.append(final["tuned_rate"])
    bottom.step(range(len(rates)), rates, where="mid", color="#1f77b4")
    bottom.set_ylabel("best ex/s")
    bottom.set_xticks(range(len(labels)), labels, rotation=40, ha="right", fontsize=7)
    fig.tight_layout()
    files.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# Real measurements: trials.Variant
# ----------------------------------------------------------------------------------------------


class TrialMeasure:
    """compare() with trials.prepare / interleaved / paired_ratios; one Variant per state, kept alive
    only while it is the best (losers are released at once so memory does not grow)."""

    def __init__(self, load, spec, found, seconds: float):
        self.load, self.spec, self.found, self.seconds = load, spec, found, seconds
        self.alive: dict[str, Any] = {}

    @staticmethod
    def _key(state: dict) -> str:
        return json.dumps(state, sort_keys=True)

    def variant(self, state: dict, name: str = "tune", log: Callable[[str], None] | None = None):
        from train.benchmarks import trials

        key = self._key(state)
        if key not in self.alive:
            self.alive[key] = trials.prepare(name, self.load(state), self.spec, self.found, log=log or _quiet)
        return self.alive[key]

    def compare(self, reference: dict, candidate: dict, rounds: int, extra: dict | None = None) -> Comparison:
        from train.benchmarks import trials

        views = [
            _view(self.variant(reference, "reference"), "best"),
            _view(self.variant(candidate, "candidate"), "candidate"),
        ]
        views.append(_view(views[0], "best again"))  # A/A: the same variant, measured twice per round
        others = []
        try:
            for name, cfg in (extra or {}).items():
                others.append(_view(trials.prepare(name, cfg, self.spec, self.found, log=_quiet), name))
            trials.interleaved(views + others, rounds, self.seconds, log=_quiet, settle_rounds=0)
        finally:
            for other in others:
                other.iterator = None
        best, cand, again = views
        return Comparison(
            ratios=trials.paired_ratios(cand, best),
            aa_ratios=trials.paired_ratios(again, best),
            reference_rate=statistics.median(best.samples),
            candidate_rate=statistics.median(cand.samples),
            extra={other.name: trials.paired_ratios(cand, other) for other in others},
            samples={view.name: list(view.samples) for view in views + others},
        )

    def keep_only(self, state: dict | None) -> None:
        keep = None if state is None else self._key(state)
        for key in [key for key in self.alive if key != keep]:
            self.alive.pop(key).iterator = None  # stops its prefetching threads
        gc.collect()


@functools.cache
def _drained_class():
    from train.benchmarks import trials

    @dataclasses.dataclass
    class Drained(trials.Variant):
        def trial(self, seconds: float, min_calls: int = MIN_CALLS) -> float:
            return super().trial(seconds, max(min_calls, MIN_CALLS))  # the pre-roll is trials.Variant's

    return Drained


def _view(variant, name: str):
    """The same model and iterator under another name, with its own samples and a pre-roll before
    each trial: while the other variants ran, this pipeline filled its buffers for free; the
    pre-roll drains them so a trial measures the steady state, not a head start."""
    from train.benchmarks import trials

    fields = {f.name: getattr(variant, f.name) for f in dataclasses.fields(trials.Variant)}
    return _drained_class()(**{**fields, "name": name, "samples": []})


def _get(cfg, key: str):
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def main(args) -> int:
    from train import scenario as scenario_lib
    from train.benchmarks import trials
    from train.input import pipeline
    from train.training import setup

    began = time.monotonic()
    scenario = scenario_lib.resolve(args.scenario)
    layers = scenario.overlays + [str(files.project_file(layer)) for layer in args.overlay]
    config_path = files.project_file(args.config)

    def load(state: dict, name: str = "tune"):
        return config_lib.load(config_path, list(args.overrides) + as_sets(state), layers=layers, name=name)

    base_cfg = load({})
    tuned_path = Path(args.tuned)
    start, earlier = {}, ""
    if tuned_path.exists() and not args.fresh:
        start, earlier = read_tuned(tuned_path)
        try:
            load(start)
        except UserError as error:
            raise UserError(f"{tuned_path} does not fit this config: {error} Delete it or pass --fresh.") from None
    out = Path(args.out)
    spec, found = trials.begin(scenario, [base_cfg], out, clean=True)
    start_cfg = load(start)
    replicas = setup.plan(start_cfg, found, spec).replicas
    knobs = plan(start_cfg, spec, found, replicas=replicas, batch=args.batch, only=args.only)
    base = {key: _get(base_cfg, key) for key in {k.key for k in knobs} | set(start) | {"train.learning_rate"}}
    if start:
        print(f"Starting from {tuned_path} ({short(start)}; {earlier}). --fresh ignores it.", flush=True)
    print(
        f"Device: {found.describe()}. Searching {len(knobs)} knobs for at most {args.minutes:g} minutes: each "
        f"candidate against the best in {args.trials} interleaved rounds of >= {args.seconds:g} s; Ctrl-C stops "
        "the search and keeps the best so far.",
        flush=True,
    )
    say = _tqdm_say

    def resolved(state: dict):
        cfg = load(state)
        return setup.resolve(cfg, found, spec)[0]

    def vet(best: dict, candidate: dict) -> str | None:
        try:
            cand = resolved(candidate)
            setup.check_batch_size(cand, spec, replicas)
            cand_cache = pipeline.memory_cache_mb(cand.pipeline, spec, spec.num_train)
        except UserError as error:
            return f"not valid here: {str(error)[:200]}"
        now = resolved(best)
        if (cand.pipeline, cand.train) == (now.pipeline, now.train):
            return "the same settings once auto is resolved"
        limit = cand.pipeline.cache_limit_mb
        if cand_cache > limit and cand_cache > pipeline.memory_cache_mb(now.pipeline, spec, spec.num_train):
            return f"its cache ({cand_cache:,.0f} MB) exceeds pipeline.cache_limit_mb ({limit})"
        floor = shuffle_floor(cand.pipeline.batch_size * replicas, spec.num_train)
        if (
            cand.pipeline.shuffle_buffer < min(floor, start_cfg.pipeline.shuffle_buffer)
            and cand.pipeline.shuffle_buffer
        ):
            return f"shuffle buffer {cand.pipeline.shuffle_buffer} below the floor {floor}"
        return None

    measure = TrialMeasure(load, spec, found, args.seconds)
    prepared = time.monotonic()
    first = measure.variant(start, "start", log=say)
    prepare_s = time.monotonic() - prepared
    call_s = first.run(3) / 3
    per_trial = max(args.seconds, MIN_CALLS * call_s) + max(trials.PREROLL_S, trials.PREROLL_CALLS * call_s)
    per_round = 3 * per_trial * 1.15
    reference = {}
    if args.reference:
        reference = {
            Path(args.reference).stem: config_lib.load(
                files.project_file(args.reference), [], layers=scenario.overlays, name="reference"
            )
        }
    shape = "x".join(map(str, spec.image_shape))
    facts = {
        "machine": found.describe(),
        "dataset": f"{spec.name} ({spec.num_train} training images of {shape}, {spec.root})",
        "scenario": ", ".join(scenario_lib.named(Path(o).stem) for o in scenario.overlays) or "none",
        "scenario_overlays": [
            str(Path(o).relative_to(files.PROJECT_ROOT)) if Path(o).is_relative_to(files.PROJECT_ROOT) else o
            for o in scenario.overlays
        ],
        "scenario_why": scenario.why,
        "config": " + ".join(
            [str(args.config)]
            + [str(layer) for layer in args.overlay]
            + (["--set " + " ".join(args.overrides)] if args.overrides else [])
        ),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "started_from": str(tuned_path) if start else None,
        "batch_searched": args.batch,
    }
    result = run(
        start,
        base,
        knobs,
        measure,
        out=out,
        tuned_path=tuned_path,
        budget_s=args.minutes * 60,
        rounds=args.trials,
        final_rounds=args.final_trials,
        first_guess_s=prepare_s + args.trials * per_round,
        final_guess_s=(1 + len(reference)) * prepare_s + args.final_trials * per_round * (3 + len(reference)) / 3,
        prepare_s=prepare_s,
        facts=facts,
        vet=vet,
        reference=reference or None,
        began=began,
        say=say,
    )
    points = [("tune/ratio_vs_best", row["gain"], row["trial"]) for row in result["trials"] if "gain" in row]
    points += [
        ("tune/best_examples_per_sec", row["best_rate"], row["trial"]) for row in result["trials"] if "gain" in row
    ]
    files.write_scalars(out / "tb", points)
    print()
    print(summary(result))
    print(f"\nWritten: {out}/tune.json, tune.md, tune.png (TensorBoard: run tune/tb)")
    return 0


def summary(result: dict) -> str:
    measured = [row for row in result["trials"] if "gain" in row]
    kept = [row for row in measured if row["kept"]]
    lines = [
        f"{len(measured)} candidates measured ({result['stopped']}), {len(kept)} kept: "
        + (", ".join(f"{row['knob']}={_fmt(row['value'])} (x{row['gain']:.2f})" for row in kept) or "none")
    ]
    final = result["final"]
    if final:
        lines.append(
            f"Final check: start {final['start_rate']:,.0f} ex/s, tuned {final['tuned_rate']:,.0f} ex/s, "
            f"x{final['gain']:.3f} (quartiles {final['q1']:.3f}-{final['q3']:.3f}, A/A noise {final['noise']:.3f})"
        )
    if result["tuned_path"]:
        lines.append(
            f"Wrote {result['tuned_path']}: "
            + ", ".join(f"{k}={_fmt(v)}" for k, v in flatten(result["overlay"]).items())
        )
        lines.append(f"Train with it: {train_command(result)}")
    if result["note"]:
        lines.append(result["note"][0].upper() + result["note"][1:] + ".")
    return "\n".join(lines)


def _quiet(line: str) -> None:
    pass


def _tqdm_say(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line)
