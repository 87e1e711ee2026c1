"""`make tune`: search, then a final check of tuned against start, then runs/tune/ and (when faster) the overlay.

The final check measures tuned against start in more rounds under the benchmarks' one rule
(stats.judge, with that check's own A/A noise). The overlay (`--tuned`, configs/tuned.yaml by
default) is written when tuned is faster beyond the noise there, or when a second Ctrl-C skipped
the check (each change then passed the rule against the best before it, and the overlay's header
says the check did not run); otherwise nothing is written and the output says so.
"""

from __future__ import annotations

import datetime
import enum
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from train import config as config_lib
from train.benchmarks import stats
from train.benchmarks.options import TuneOptions
from train.benchmarks.tune import overlay as overlay_lib
from train.benchmarks.tune import report
from train.benchmarks.tune.measure import MIN_CALLS as MIN_TRIAL_CALLS
from train.benchmarks.tune.search import Measure, changes, search, short
from train.benchmarks.tune.space import Knob
from train.core import files
from train.core.errors import UserError


class Final(enum.Enum):
    NOT_RUN = "not run"  # nothing changed: nothing to check
    FASTER = "faster"
    NOT_FASTER = "not faster"
    INTERRUPTED = "interrupted"  # a second Ctrl-C during the check


RULE = (
    f"keep a change when the median of its per-round ratios against the best > 1 + max({stats.MIN_GAIN}, "
    "A/A noise of the best) and the lower quartile of its ratios > 1 (stats.judge)"
)


def final_check(measure: Measure, start: dict, best: dict, rounds: int, reference: dict | None, say) -> tuple:
    """(Final, the check's figures or None): tuned against start, plus any reference presets, same rounds."""
    say(f"Final check: tuned ({short(changes(best, start))}) against start, {rounds} rounds.")
    try:
        comparison = measure.compare(start, best, rounds, extra=reference)
    except KeyboardInterrupt:
        return Final.INTERRUPTED, None
    finally:
        measure.keep_only(None)
    verdict = stats.judge(comparison.ratios, comparison.aa_ratios)
    figures = {
        "ratios": comparison.ratios,
        "aa_ratios": comparison.aa_ratios,
        "gain": verdict.gain.median,
        "q1": verdict.gain.q1,
        "q3": verdict.gain.q3,
        "min": verdict.gain.low,
        "max": verdict.gain.high,
        "noise": verdict.noise,
        "threshold": verdict.threshold,
        "verdict": verdict.word,
        "faster": verdict.faster,
        "start_rate": comparison.reference_rate,
        "tuned_rate": comparison.candidate_rate,
        "samples": comparison.samples,
        "against": {
            name: {"ratios": ratios, "median": statistics.median(ratios)} for name, ratios in comparison.extra.items()
        },
    }
    say(f"  tuned / start: {verdict.line()}: " + ("faster" if verdict.faster else f"NOT faster ({verdict.word})"))
    for name, row in figures["against"].items():
        say(f"  tuned / {name}: x{row['median']:.3f} (per round {min(row['ratios']):.3f}-{max(row['ratios']):.3f})")
    return (Final.FASTER if verdict.faster else Final.NOT_FASTER), figures


NOTES = {
    Final.NOT_RUN: "no candidate was faster than the start beyond the noise: nothing to write",
    Final.NOT_FASTER: "tuned was not faster than start beyond the noise in the final check: nothing written",
    Final.INTERRUPTED: (
        "final check interrupted: written without it; each change passed the noise rule against "
        "the best before it (run make tune again to check)"
    ),
}

NOTHING_MEASURED = "no candidate was measured (every one skipped, or none fitted the budget): nothing to write"


def final_reserve(
    per_trial_s: float, final_guess_s: float, prepare_s: float, rounds: int, final_rounds: int, references: int
) -> float:
    """Seconds kept aside for the final check. A search trial measures 3 views for `rounds` rounds; the final
    check 3 + `references` views for `final_rounds`, after building the start and each reference again:
    scaled from the search's trials as measured."""
    views = 3 + references
    return max(final_guess_s, (1 + references) * prepare_s + per_trial_s * final_rounds * views / (3 * rounds))


def check_budget(budget_s: float, spent_s: float, first_guess_s: float, reserve_s: float, trial_s: float) -> None:
    """Refuse a budget that cannot hold one candidate and the final check, with the minutes that would hold
    three: a search that measures nothing would report the start as the best it found."""
    one = spent_s + first_guess_s + reserve_s
    if one <= budget_s:
        return
    from train.benchmarks.trials import EPOCH_ALIGN_MAX_S  # TensorFlow, only on this path

    three = math.ceil((spent_s + 3 * first_guess_s + reserve_s) / 60)
    raise UserError(
        f"--minutes {budget_s / 60:g} cannot hold one candidate here: one trial of the start took {trial_s:.1f} s "
        f"on this machine (a trial lasts at least {MIN_TRIAL_CALLS} executions, and whole epochs where one takes at "
        f"most {EPOCH_ALIGN_MAX_S:.0f} s), so a candidate takes about {first_guess_s / 60:.1f} min and the "
        f"final check about {reserve_s / 60:.1f} min, after {spent_s / 60:.1f} min of set-up. Pass a larger budget, "
        f'e.g. ARGS="--minutes {three}" (about three candidates), or --only KNOB to search fewer knobs.'
    )


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
    found = search(
        start,
        knobs,
        measure,
        rounds=rounds,
        deadline=began + budget_s,
        first_guess_s=first_guess_s,
        reserve=lambda per_trial_s: final_reserve(
            per_trial_s, final_guess_s, prepare_s, rounds, final_rounds, len(reference or {})
        ),
        vet=vet,
        base=base,
        clock=clock,
        say=say,
        progress=progress,
    )
    outcome, final = Final.NOT_RUN, None
    note = NOTES[Final.NOT_RUN] if any("gain" in row for row in found.trials) else NOTHING_MEASURED
    if found.best != start:
        outcome, final = final_check(measure, start, found.best, final_rounds, reference, say)
    else:
        measure.keep_only(None)
    written = outcome in (Final.FASTER, Final.INTERRUPTED)
    result = {
        "rule": RULE,
        **facts,
        "changes_learning": [knob.key for knob in knobs if knob.also],  # keys that move the learning rate too
        **{"budget_minutes": budget_s / 60, "rounds": rounds, "final_rounds": final_rounds, "start": start},
        **{"best": found.best, "stopped": found.stopped, "trials": found.trials, "search_seconds": found.seconds},
        "final": final,
        "final_outcome": outcome.value,
        "overlay": overlay_lib.overlay(found.best, base) if written else None,
        "tuned_path": str(tuned_path) if written else None,
        "note": note if outcome is Final.NOT_RUN else NOTES.get(outcome),
    }
    if not written and tuned_path.exists():
        result["note"] = (result["note"] or "") + f"; {tuned_path} left as it was"
    if written:
        text = overlay_lib.tuned_header(result) + yaml.safe_dump(result["overlay"], sort_keys=False)
        files.write_text(tuned_path, text)
    result["seconds"] = clock() - began
    report.WRITER.write(out, result)
    return result


def facts_of(opts: TuneOptions, found, spec, scenario, started_from: Path | None) -> dict:
    """Where, on what and from which config: the overlay's header and tune.json carry these."""
    from train import scenario as scenario_lib
    from train import workloads

    workload = workloads.get(config_lib.workload_of(files.project_file(opts.config)))
    return {
        "machine": found.describe(),
        "dataset": workload.dataset_line(spec),
        "workload": workload.name,
        "unit": workload.unit.label,
        "scenario": ", ".join(scenario_lib.named(Path(o).stem) for o in scenario.overlays) or "none",
        "scenario_overlays": [
            str(Path(o).relative_to(files.PROJECT_ROOT)) if Path(o).is_relative_to(files.PROJECT_ROOT) else o
            for o in scenario.overlays
        ],
        "scenario_why": scenario.why,
        "config": " + ".join(
            [str(opts.config)]
            + [str(layer) for layer in opts.overlays]
            + (["--set " + " ".join(opts.overrides)] if opts.overrides else [])
        ),
        "config_path": str(opts.config),
        "user_overlays": [str(layer) for layer in opts.overlays],
        "overrides": list(opts.overrides),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "started_from": str(started_from) if started_from else None,
        "batch_searched": opts.batch,
    }


def load_reference(opts: TuneOptions, scenario) -> dict:
    if not opts.reference:
        return {}
    path = files.project_file(opts.reference)
    return {Path(opts.reference).stem: config_lib.load(path, [], layers=scenario.overlays, name="reference")}
