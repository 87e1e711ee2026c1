"""`make bench`: naive vs optimized vs the compute ceiling, in repeated interleaved trials.

The ceiling is the same model fed one batch of real examples repeated from memory: what
the model does with zero input cost. The data-service variants run the optimized pipeline
on 1 and 2 local tf.data service workers and ship the batches to the trainer over gRPC.
Every variant runs in its own process, stopped while another is measured (isolated.py);
`speedup` (optimized / naive) and `efficiency` (optimized / ceiling) are medians of per-round
ratios, and the optimized variant is measured twice per round for the A/A noise (stats.py).
Where `auto` chose a decoded snapshot on disk, the pipeline auto takes without the cache
folder is measured too. Then each pipeline alone, and the decode floor (images:
train/workloads/image/floor.py): the CPU cost per image, its multiple of the floor, and the
host cores it takes per 1,000 images/s. Rates are in the workload's unit (text: real tokens/s,
padding left out; its ceiling is one epoch of the optimized batches from memory, every bucket's
shape); the data service variants and the decode floor are measured where the workload has them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from train import scenario as scenario_lib
from train import workloads
from train.benchmarks import bench_report, isolated, stats, trials
from train.benchmarks.options import BenchOptions
from train.training import plan as plan_lib


@dataclasses.dataclass
class Planned:
    name: str
    cfg: object
    ceiling: bool = False
    service_workers: int = 0


def plan(opts: BenchOptions, scenario, spec, found) -> tuple[list[Planned], dict]:
    """The variants to measure, and the decoded snapshot's facts when `auto` chose one."""
    sets = list(opts.variants.overrides)
    naive = scenario.load(opts.variants.naive, sets, name="naive")
    optimized = scenario.load(opts.variants.optimized, sets, name="optimized")
    planned = [Planned("naive", naive), Planned("optimized", optimized), Planned("ceiling", optimized, ceiling=True)]
    workload = workloads.get(optimized.workload)
    snapshot = workload.snapshot(plan_lib.plan(optimized, found, spec).cfg, spec) or {}
    if snapshot:
        without = scenario.load(opts.variants.optimized, sets + snapshot.pop("without"), name="without_snapshot")
        planned.append(Planned("without_snapshot", without))
    for workers in opts.data_service_workers if workload.features.data_service else ():
        planned.append(Planned(f"service_{workers}w", optimized, service_workers=workers))
    return planned, snapshot


def measure_costs(workload, configs: dict, ceiling_rate: float | None) -> tuple[dict | None, dict]:
    """The decode floor (where the workload has one) and each pipeline alone (no model), each in a fresh process
    with nothing else running, with what that cost means against the model's rate."""
    floor = (
        isolated.measure_alone("floor", configs["optimized"], seconds=3.0) if workload.features.decode_floor else None
    )
    costs = {}
    for name, cfg in configs.items():
        cost = isolated.measure_alone("cost", cfg, seconds=3.0)
        costs[name] = {**cost, **workload.cost_figures(cost, floor, ceiling_rate or 0.0)}
    return floor, costs


def main(opts: BenchOptions) -> int:
    scenario = scenario_lib.for_preset(opts.variants.scenario, opts.variants.naive)
    out = Path(opts.out)
    first = scenario.load(opts.variants.optimized, list(opts.variants.overrides), name="optimized")
    spec, found = trials.begin(scenario, [first], out)
    planned, snapshot = plan(opts, scenario, spec, found)
    print(
        f"Device: {found.describe()}. {opts.trials.rounds} interleaved rounds of >= {opts.trials.seconds:g} s "
        "per variant after warm-up, each variant in its own process, stopped while another is measured.",
        flush=True,
    )
    variants: list[isolated.IsolatedVariant] = []
    try:
        for item in planned:
            variants.append(
                isolated.IsolatedVariant(
                    item.name, item.cfg, ceiling=item.ceiling, service_workers=item.service_workers
                )
            )
        by_name = {v.name: v for v in variants}
        if snapshot:
            snapshot["first_epoch_seconds"] = by_name["optimized"].facts.warmup_seconds
            snapshot.update(bench_report.snapshot_size(snapshot))
        again = by_name["optimized"].view("optimized_again")
        isolated.interleaved([*variants, again], opts.trials.rounds, opts.trials.seconds)
        peak = max(v.peak_rss_mb() for v in variants)
    finally:
        isolated.close_all(variants)
    rows = {v.name: bench_report.row(v) for v in variants}
    local = by_name["optimized"]
    costed = {p.name: p.cfg for p in planned if p.name in ("naive", "optimized", "without_snapshot")}
    workload = workloads.get(first.workload)
    decode_floor, costs = measure_costs(workload, costed, rows["ceiling"]["median"])
    aa = stats.paired(again.samples, local.samples)
    speedup = stats.gain(local.samples, by_name["naive"].samples)
    efficiency = stats.gain(local.samples, by_name["ceiling"].samples)
    result = {
        "device": found.describe(),
        "host_cores": found.cpu_cores,
        "scenario": scenario.why,
        "workload": workload.name,
        "unit": local.facts.unit,
        "model": first.model.name,
        **workload.shape_facts(spec),
        "trials": opts.trials.rounds,
        "trial_seconds": opts.trials.seconds,
        "isolation": "each variant in its own process, stopped (SIGSTOP) while another is measured",
        "variants": rows,
        "speedup": speedup.median,
        "speedup_gain": speedup.as_dict(),
        "speedup_range": [speedup.low, speedup.high],
        "efficiency": efficiency.median,
        "efficiency_gain": efficiency.as_dict(),
        "efficiency_range": [efficiency.low, efficiency.high],
        "aa": stats.Gain.of(aa).as_dict(),
        "noise": stats.noise(aa),
        "data_service": {
            v.name: stats.gain(v.samples, local.samples).median for v in variants if v.name.startswith("service_")
        },
        "decode_floor": decode_floor,
        "pipeline_cost": costs,
        "snapshot": snapshot or None,
        "peak_rss_mb": peak,
    }
    if "without_snapshot" in by_name:
        result["snapshot"]["gain"] = stats.gain(local.samples, by_name["without_snapshot"].samples).as_dict()
    bench_report.WRITER.write(out, result)
    bench_report.write_tensorboard(out, [*variants, again], f"bench/{workload.unit.tag}")
    print()
    print(bench_report.table(result))
    print(f"\nWritten: {out}/bench.json, bench.md (TensorBoard: runs bench/tb/*)")
    return 0
