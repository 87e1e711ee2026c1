"""`make prove`: the doctor's fixes for a run of this template, each proved as a config overlay.

The doctor reads a run's profile (`make compare`'s naive run by default) and names its fixes
with this template's knobs ("In this template: pipeline.cache: auto"). Here each fix is made as
the ladder rung that turns that technique on (configs/ladder/: the same overlays `make ladder`
climbs) and measured as `make tune` measures a candidate (tune/measure.py: every variant in its
own process, paired rounds in both orders, the run's config measured twice per round for the
A/A noise), judged by the benchmarks' one rule (stats.judge). Then the proved fixes together,
in one rotation with the optimized preset (expressed as an overlay of the run's config), so the
report says what share of the optimized preset's gain the doctor's fixes reach, and names every
difference between the two that no proved fix made, and why: a fix that changes what is learned
(the generator's Python augmentation, the batch size, the precision) is tried only where
`--allow` names it; a rung that measured no gain is not kept; what the doctor did not name in
this profile is said as such. A fix hides what stands behind it (a Python generator hides the
pipeline that replaces it), so each pass after the first trains the config with the fixes proved
so far, profiles it, and measures the fixes the doctor names there on top of them (`--passes`).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from step_doctor import machine
from step_doctor.diagnose import diagnose
from step_doctor.diagnose.diagnosis import RunDiagnosis
from step_doctor.diagnose.recommendation import CORRECTNESS
from train import config as config_lib
from train import scenario as scenario_lib
from train.benchmarks import ladder as ladder_lib
from train.benchmarks import stats, trials
from train.benchmarks.compare import fit_in_subprocess
from train.benchmarks.options import ProveOptions
from train.benchmarks.report_writer import ReportWriter
from train.benchmarks.tune.measure import TrialMeasure
from train.benchmarks.tune.overlay import as_sets, flatten
from train.benchmarks.tune.search import CandidateFailed
from train.core import files
from train.core.errors import RunFailed, UserError

# a cause the doctor names, and the fix it offers (Recommendation.estimates' key, where it offers several) -> the
# ladder rung that makes it here
RUNG_OF = {
    "python-generator": {None: "tfrecord + interleave"},
    "sequential-file-reads": {None: "tfrecord + interleave"},
    "python-in-map": {None: "parallel map"},
    "sequential-map": {"parallel-calls": "parallel map", "cache": "cache"},
    "heavy-map": {"parallel-calls": "parallel map", "cache": "cache"},
    "decode-every-epoch": {None: "cache"},
    "slow-file-reads": {None: "cache"},
    "no-prefetch": {None: "prefetch"},
    "slow-augmentation": {None: "vectorized augmentation"},
    "small-batch": {None: "larger batch"},
    "per-step-overhead": {None: "steps_per_execution"},
    "float32": {None: "mixed precision"},
}
# a rung that changes what the run computes -> the name --allow takes, and what it changes
ALLOW = {
    "tfrecord + interleave": (
        "generator",
        "it replaces the Python generator and its numpy augmentation with tf.data ops, reading the shards in another "
        "order",
    ),
    "larger batch": ("batch", "a batch of 256 changes the optimization (the learning rate scales with it)"),
    "mixed precision": ("precision", "it computes in 16 bits"),
}
SECTIONS = ("pipeline", "train", "data", "text")  # what a preset sets that makes it fast (not its name or model)


@dataclass
class Candidate:
    rung: str
    causes: list[str]
    estimated_gain: float | None
    state: dict  # the rung's overlay: key -> value
    passed: int = 1  # the pass that measured it
    against: dict = field(default_factory=dict)  # the fixes proved before it, which it was measured on top of
    verdict: stats.Verdict | None = None
    why: str | None = None  # not measured: why


@dataclass
class Plan:
    candidates: list[Candidate] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)  # {"cause", "rung", "why"}


def run_diagnosis(run: Path) -> RunDiagnosis:
    """The doctor's diagnosis of the run's own profile; a clear error where there is none."""
    if not (run / "config.yaml").is_file():
        raise UserError(
            f"{run} is not a run of this template (no config.yaml there). Run `make compare` first, or pass "
            "--run runs/<folder>/<run> of a run that profiled itself."
        )
    found = diagnose(run).runs
    item = found.get(".") or next(iter(found.values()), None)
    if not isinstance(item, RunDiagnosis):
        why = getattr(item, "error", "no profile")
        raise UserError(f"The profile of {run} cannot be read: {why}. Train it again with profiling on.")
    return item


def plan(item: RunDiagnosis, rungs: dict[str, dict], allow: set[str], proved: set[str] = frozenset()) -> Plan:
    """The rung to measure for each fix the doctor names (but those `proved` in an earlier pass), and why each other
    fix is not measured."""
    made = Plan()
    by_rung: dict[str, Candidate] = {}
    for rec in item.recommendations:
        if rec.kind == CORRECTNESS:
            continue
        offers = RUNG_OF.get(rec.cause)
        if not offers:
            made.refused.append({"cause": rec.cause, "rung": None, "why": "no knob of this template makes this fix"})
            continue
        for fix, name in offers.items():
            if fix is not None and rec.estimates is not None and fix not in rec.estimates:
                continue  # a fix this cause does not offer here (a cache of a random map)
            estimate = rec.estimates.get(fix) if fix and rec.estimates else rec.estimated_gain
            if name not in rungs:
                why = "the ladder of this workload has no such rung"
                made.refused.append({"cause": rec.cause, "rung": name, "why": why})
                continue
            allowed, changes = ALLOW.get(name, (None, None))
            if allowed and allowed not in allow:
                made.refused.append(
                    {"cause": rec.cause, "rung": name, "why": f"{changes}: tried with --allow {allowed}"}
                )
                continue
            if name in proved:
                continue
            if name in by_rung:
                by_rung[name].causes.append(rec.cause)
                continue
            by_rung[name] = Candidate(name, [rec.cause], estimate, dict(rungs[name]["set"]))
    made.candidates = list(by_rung.values())
    return made


def preset_as_overlay(base, preset) -> dict:
    """The keys `preset` sets otherwise than `base` (their speed sections), as an overlay of `base`."""
    mine, theirs = flatten(config_lib.to_dict(base)), flatten(config_lib.to_dict(preset))
    return {
        key: value
        for key, value in theirs.items()
        if key.split(".")[0] in SECTIONS and mine.get(key) != value and value is not None
    }


def main(opts: ProveOptions) -> int:
    scenario = scenario_lib.for_preset(opts.scenario, opts.config)
    base = scenario.load(opts.config, list(opts.overrides))
    run = files.project_file(opts.run or Path("runs/compare") / base.name)  # make compare's run of that config
    item = run_diagnosis(run)
    ladder_path = ladder_lib.default_ladder(scenario, base.workload)
    rungs = {rung["name"]: rung for rung in ladder_lib.load_ladder(ladder_path)["rungs"]}

    def load(state: dict, name: str = "prove"):
        return scenario.load(opts.config, list(opts.overrides) + as_sets(state), name=name)

    optimized = preset_as_overlay(base, scenario.load(opts.optimized, list(opts.overrides), name="optimized"))
    for rung in rungs.values():  # every overlay is validated before anything runs
        load(rung["set"])
    load(optimized)
    out = Path(opts.out)
    spec, found = trials.begin(scenario, [base], out, clean=True)
    rounds = opts.trials.rounds
    print(
        f"Device: {found.describe()}. The doctor's fixes for {run}, each a rung of {ladder_path.name} against the "
        f"run's config in {rounds} paired rounds of >= {opts.trials.seconds:g} s, each variant in its own process; "
        f"at most {opts.passes} passes, each after profiling the config with the fixes proved before it.",
        flush=True,
    )
    measure = TrialMeasure(load, opts.trials.seconds)
    made, state, stopped = Plan(), {}, None
    try:
        for number in range(1, opts.passes + 1):
            if number > 1:
                measure.keep_only({})  # no variant's process beside the profiled run
                try:
                    item = _profile_again(opts, scenario, state, out, number)
                except (RunFailed, UserError) as error:
                    stopped = f"pass {number} could not profile the fixes proved so far: {error}"
                    break
            proved = {c.rung for c in made.candidates if c.verdict and c.verdict.faster}
            found_now = plan(item, rungs, set(opts.allow), proved=proved)  # a rung of no gain may gain now
            made.refused += [r for r in found_now.refused if r not in made.refused]
            for candidate in found_now.candidates:
                candidate.passed, candidate.against = number, dict(state)
                _measure_on(candidate, state, measure, rounds)
            made.candidates += found_now.candidates
            before = dict(state)
            for candidate in sorted(found_now.candidates, key=lambda c: list(rungs).index(c.rung)):
                if candidate.verdict and candidate.verdict.faster:
                    state.update(candidate.state)
            if state == before:
                break  # nothing new proved: the next profile would be this one's
        measure.keep_only({})
        print("  the proved fixes together, with the optimized preset ...", flush=True)
        together_ratios, optimized_ratios, aa = _together(measure, state, optimized, load, rounds)
    finally:
        measure.close()
    run_values = flatten(config_lib.to_dict(base))
    measured = {"together": together_ratios, "optimized": optimized_ratios, "aa": aa}
    result = _result(run, made, state, optimized, measured, rungs, found, opts, run_values)
    result["stopped"] = stopped
    REPORT.write(out, result)
    print()
    print(REPORT.table(result))
    print(f"\nWritten: {out}/prove.json, prove.md")
    return 0


def _measure_on(candidate: Candidate, state: dict, measure: TrialMeasure, rounds: int) -> None:
    """The candidate's rung on top of the fixes proved so far, against them; or why it is not measured."""
    undone = sorted(k for k, v in candidate.state.items() if k in state and state[k] != v)
    if undone:  # tfrecord + interleave's per-example augmentation over a proved batched one
        candidate.why = f"it would undo {', '.join(undone)} of the fixes proved before it"
        return
    merged = {**state, **candidate.state}
    if merged == state:
        candidate.why = "the fixes proved before it set it already"
        return
    print(f"  pass {candidate.passed}: {candidate.rung} ({', '.join(candidate.causes)}) ...", flush=True)
    try:
        compared = measure.compare(state, merged, rounds)
        candidate.verdict = stats.judge(compared.ratios, compared.aa_ratios)
    except CandidateFailed as error:
        candidate.why = str(error)
    measure.keep_only(state)


def _together(measure: TrialMeasure, state: dict, optimized: dict, load, rounds: int):
    """The per-round ratios of the proved fixes together and of the optimized preset over the run's config, and the
    A/A ratios of their rounds; the optimized preset alone where nothing is proved or the rotation failed."""
    if state:
        try:
            compared = measure.compare({}, state, rounds, extra={"optimized": load(optimized, "optimized")})
            optimized_ratios = [r / e for r, e in zip(compared.ratios, compared.extra["optimized"]) if e]
            return compared.ratios, optimized_ratios, compared.aa_ratios
        except CandidateFailed as error:
            print(f"  the rotation with the optimized preset failed ({error}): the preset alone ...", flush=True)
    try:
        compared = measure.compare({}, optimized, rounds)
    except CandidateFailed as error:
        raise RunFailed(
            f"The optimized preset cannot run here, so no share of its gain can be measured: {error}"
        ) from None
    return [], compared.ratios, compared.aa_ratios


def _profile_again(opts: ProveOptions, scenario, state: dict, out: Path, number: int) -> RunDiagnosis:
    """A profiled run of the config with the fixes proved so far, and the doctor's diagnosis of it: what the fixes
    uncovered (a Python generator hides the pipeline that replaces it)."""
    name = f"pass-{number}"
    print(f"  pass {number}: training the config with the fixes proved so far, to profile it ...", flush=True)
    overrides = list(opts.overrides) + as_sets(state) + [f"runs_dir={out}", f"name={name}", "train.epochs=2"]
    fit_in_subprocess(opts.config, scenario.overlays, overrides)
    return run_diagnosis(out / name)


def _result(run, made, together, optimized, measured, rungs, found, opts, run_values) -> dict:
    """prove.json: `measured` holds the per-round ratios of the fixes together and of the optimized preset over the
    run's config, and the A/A ratios of their rounds."""
    together_ratios, optimized_ratios, aa = measured["together"], measured["optimized"], measured["aa"]
    together_gain = statistics.median(together_ratios) if together_ratios else None
    optimized_gain = statistics.median(optimized_ratios) if optimized_ratios else None
    share = together_gain / optimized_gain if together_gain and optimized_gain else None
    return {
        "run": str(run),
        "device": found.describe(),
        "cpu": machine.cpu_record(),
        "load_average": list(os.getloadavg()),
        "rounds": opts.trials.rounds,
        "seconds": opts.trials.seconds,
        "allow": list(opts.allow),
        "passes": opts.passes,
        "fixes": [
            {
                "rung": c.rung,
                "pass": c.passed,
                "on_top_of": sorted(c.against),
                "causes": c.causes,
                "set": c.state,
                "estimated_gain": c.estimated_gain,
                **({"measured": c.verdict.as_dict()} if c.verdict else {}),
                "verdict": c.verdict.word if c.verdict else "not measured",
                "why": c.why,
            }
            for c in made.candidates
        ],
        "refused": made.refused,
        "together": {
            "set": together,
            **({"measured": stats.judge(together_ratios, aa).as_dict()} if together_ratios else {}),
        },
        "optimized": {"set": optimized, "measured": stats.judge(optimized_ratios, aa).as_dict()},
        "share_of_optimized": round(share, 3) if share is not None else None,
        "not_made": _not_made(together, optimized, made, rungs, run_values),
    }


def _not_made(together: dict, optimized: dict, made: Plan, rungs: dict, run_values: dict) -> list[dict]:
    """Each key the optimized preset sets otherwise than the proved fixes together, and why no proved fix set it."""
    found = []
    for key, value in optimized.items():
        if together.get(key) == value or (key in together and value == "auto"):
            continue  # made; a rung's explicit value stands for the preset's auto (steps_per_execution 16)
        setting = [name for name, r in rungs.items() if key in r["set"]]
        # the rung that sets the optimized preset's value (pipeline.augment: batched, not per_example)
        rung = next((name for name in setting if str(rungs[name]["set"][key]) == str(value)), None)
        rung = rung or next(iter(setting), None)
        refused = next((r for r in made.refused if r["rung"] == rung), None) if rung else None
        measured = next((c for c in reversed(made.candidates) if c.rung == rung), None) if rung else None
        if refused:
            why = f"{', '.join(dict.fromkeys(r['cause'] for r in made.refused if r['rung'] == rung))}: {refused['why']}"
        elif measured:
            why = f"the {rung} rung was measured: {measured.verdict.word if measured.verdict else measured.why}"
        elif rung:
            why = f"the doctor did not name the {rung} rung's fix in this profile (profile again after the fixes)"
        else:
            why = "no ladder rung sets it (the optimized preset's own choice)"
        here = together.get(key, run_values.get(key))
        found.append({"key": key, "optimized": value, "run": here, "why": why})
    return found


def _table(result: dict) -> str:
    lines = [
        "| pass | fix (ladder rung) | causes | estimated | measured (quartiles) | verdict |",
        "|---:|---|---|---:|---:|---|",
    ]
    for fix in result["fixes"]:
        measured = fix.get("measured")
        shown = f"x{measured['median']:.2f} ({measured['q1']:.2f}-{measured['q3']:.2f})" if measured else "-"
        estimate = f"x{fix['estimated_gain']:.2f}" if fix["estimated_gain"] else "-"
        verdict = fix["verdict"] + (f": {fix['why']}" if fix["why"] else "")
        lines.append(
            f"| {fix['pass']} | {fix['rung']} | {', '.join(fix['causes'])} | {estimate} | {shown} | {verdict} |"
        )
    for refused in result["refused"]:
        lines.append(f"| - | {refused['rung'] or '-'} | {refused['cause']} | - | - | not tried: {refused['why']} |")
    together = result["together"].get("measured")
    if together:
        lines.append(
            f"| - | the proved fixes together | - | - | x{together['median']:.2f} ({together['q1']:.2f}-"
            f"{together['q3']:.2f}) | {together['verdict']} |"
        )
    optimized = result["optimized"]["measured"]
    lines.append(
        f"| - | the optimized preset | - | - | x{optimized['median']:.2f} ({optimized['q1']:.2f}-"
        f"{optimized['q3']:.2f}) | {optimized['verdict']} |"
    )
    share = result["share_of_optimized"]
    lines.append("")
    if any(fix["pass"] > 1 for fix in result["fixes"]):
        lines.append("A fix of a later pass is measured on top of the fixes proved before it.")
    lines.append(
        f"The proved fixes reach {share:.0%} of the optimized preset's gain."
        if share is not None
        else "Nothing proved: the optimized preset's gain is measured alone."
    )
    if result.get("stopped"):
        lines.append(f"The passes stopped early: {result['stopped']}")
    if result["not_made"]:
        lines.append("What the optimized preset sets that no proved fix made, and why:")
        lines += [f"- {d['key']}: {d['optimized']} (here {d['run']}): {d['why']}" for d in result["not_made"]]
    return "\n".join(lines)


REPORT = ReportWriter("prove", table=_table, markdown=lambda result: _table(result) + "\n")
