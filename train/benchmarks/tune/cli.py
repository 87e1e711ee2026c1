"""`python -m train tune`: options in, the start config, the search space and the measure wired together."""

from __future__ import annotations

import time
from pathlib import Path

from train import config as config_lib
from train import scenario as scenario_lib
from train import workloads
from train.benchmarks import trials
from train.benchmarks.options import TuneOptions
from train.benchmarks.tune import command, report, space
from train.benchmarks.tune.measure import MIN_CALLS, TrialMeasure
from train.benchmarks.tune.overlay import as_sets, read_tuned
from train.benchmarks.tune.search import short
from train.core import files
from train.core.errors import UserError
from train.training import plan


def say(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line)


def make_vet(load, found, spec, replicas: int, start):
    """Why a candidate is not worth measuring here (invalid, or the workload's reasons: the same once resolved,
    images' cache over the limit or shuffle buffer below the floor), or None."""

    def resolved(state: dict):
        return plan.plan(load(state), found, spec).cfg

    def vet(best: dict, candidate: dict) -> str | None:
        try:
            cand = resolved(candidate)
            return workloads.get(cand.workload).vet(cand, resolved(best), spec, replicas, start)
        except UserError as error:
            return f"not valid here: {str(error)[:200]}"

    return vet


def main(opts: TuneOptions) -> int:
    began = time.monotonic()
    scenario = scenario_lib.for_preset(opts.scenario, opts.config)
    layers = scenario.overlays + [str(files.project_file(layer)) for layer in opts.overlays]
    config_path = files.project_file(opts.config)

    def load(state: dict, name: str = "tune"):
        return config_lib.load(config_path, list(opts.overrides) + as_sets(state), layers=layers, name=name)

    base_cfg = load({})
    tuned_path = Path(opts.tuned)
    start, earlier = {}, ""
    if tuned_path.exists() and not opts.fresh:
        start, earlier = read_tuned(tuned_path)
        try:
            load(start)
        except UserError as error:
            raise UserError(f"{tuned_path} does not fit this config: {error} Delete it or pass --fresh.") from None
    out = Path(opts.out)
    spec, found = trials.begin(scenario, [base_cfg])  # out is emptied once the budget is accepted
    start_cfg = load(start)
    replicas = plan.plan(start_cfg, found, spec).replicas
    knobs = space.plan(start_cfg, spec, found, replicas=replicas, batch=opts.batch, only=list(opts.only))
    base = {key: space.get(base_cfg, key) for key in {k.key for k in knobs} | set(start) | {"train.learning_rate"}}
    if start:
        print(f"Starting from {tuned_path} ({short(start)}; {earlier}). --fresh ignores it.", flush=True)
    print(
        f"Device: {found.describe()}. Searching {len(knobs)} knobs for at most {opts.minutes:g} minutes: each "
        f"candidate against the best in {opts.trials.rounds} interleaved rounds of >= {opts.trials.seconds:g} s, "
        "each variant in its own process; Ctrl-C stops the search and keeps the best so far.",
        flush=True,
    )
    measure = TrialMeasure(load, opts.trials.seconds)
    try:
        result = search_and_write(opts, measure, start, base, knobs, began, spec, found, scenario, tuned_path)
    finally:
        measure.close()
    points = [("tune/ratio_vs_best", row["gain"], row["trial"]) for row in result["trials"] if "gain" in row]
    tag = f"tune/best_{workloads.of_record(result).unit.tag}"
    points += [(tag, row["best_rate"], row["trial"]) for row in result["trials"] if "gain" in row]
    files.write_scalars(out / "tb", points)
    print()
    print(report.summary(result))
    print(f"\nWritten: {out}/tune.json, tune.md, tune.png (TensorBoard: run tune/tb)")
    return 0


def search_and_write(opts, measure, start, base, knobs, began, spec, found, scenario, tuned_path) -> dict:
    """Time the start variant (its preparation, one trial), then run the search and the final check."""
    load = measure.load
    prepared = time.monotonic()
    first = measure.variant(start, "start", log=say)
    prepare_s = time.monotonic() - prepared
    timed = time.monotonic()
    first.trial(opts.trials.seconds, MIN_CALLS)
    first.samples.clear()
    trial_s = time.monotonic() - timed
    per_round = 3 * trial_s * 1.15
    reference = command.load_reference(opts, scenario)
    first_guess_s = prepare_s + opts.trials.rounds * per_round
    final_guess_s = (1 + len(reference)) * prepare_s + opts.final_rounds * per_round * (3 + len(reference)) / 3
    reserve_s = command.final_reserve(
        first_guess_s, final_guess_s, prepare_s, opts.trials.rounds, opts.final_rounds, len(reference)
    )
    command.check_budget(opts.minutes * 60, time.monotonic() - began, first_guess_s, reserve_s, trial_s)
    trials.output_folder(Path(opts.out), clean=True)  # a refused budget leaves the last tune's results as they were
    return command.run(
        start,
        base,
        knobs,
        measure,
        out=Path(opts.out),
        tuned_path=tuned_path,
        budget_s=opts.minutes * 60,
        rounds=opts.trials.rounds,
        final_rounds=opts.final_rounds,
        first_guess_s=first_guess_s,
        final_guess_s=final_guess_s,
        prepare_s=prepare_s,
        facts=command.facts_of(opts, found, spec, scenario, tuned_path if start else None),
        vet=make_vet(load, found, spec, plan.plan(load(start), found, spec).replicas, load(start)),
        reference=reference or None,
        began=began,
        say=say,
    )
