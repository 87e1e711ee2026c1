"""`make bench`: naive vs optimized vs the compute ceiling, in repeated interleaved trials.

The ceiling is the same model fed one batch of real examples repeated from memory: what
the model does with zero input cost. The data-service variants run the optimized pipeline
on 1 and 2 local tf.data service workers and ship the batches to the trainer over gRPC.
`speedup` = optimized / naive and `efficiency` = optimized / ceiling, both from medians of
the same run; min-max spreads are reported so a reader can judge the noise of a shared machine.
"""

from __future__ import annotations

import gc
import resource
import statistics
from pathlib import Path

from train import scenario as scenario_lib
from train.benchmarks import trials
from train.core import files
from train.input import service


def ratio(numerator: dict, denominator: dict) -> float | None:
    if numerator["median"] and denominator["median"]:
        return numerator["median"] / denominator["median"]
    return None


def write_tensorboard(out: Path, variants: list[trials.Variant]) -> None:
    """Every trial as a scalar, one TensorBoard run per variant (runs bench/tb/<variant>)."""
    for variant in variants:
        files.write_scalars(
            out / "tb" / variant.name,
            [("bench/examples_per_sec", rate, index) for index, rate in enumerate(variant.samples)],
        )


def _stats(variant: trials.Variant) -> dict:
    return {
        **variant.stats(),
        "batch_size": variant.batch_size,
        "pipeline": variant.description,
        "precision": variant.choices.precision,
        "jit_compile": variant.choices.jit_compile,
        "steps_per_execution": variant.choices.steps_per_execution,
    }


def table(result: dict) -> str:
    lines = [f"{'variant':<11}{'median ex/s':>13}{'min':>10}{'max':>10}  batch  pipeline"]
    for name, row in result["variants"].items():
        lines.append(
            f"{name:<11}{row['median']:>13,.0f}{row['min']:>10,.0f}{row['max']:>10,.0f}  "
            f"{row['batch_size']:>5}  {row['pipeline']}"
        )
    lines.append(
        f"speedup (optimized / naive, medians): {result['speedup']:.2f}x "
        f"(per-trial ratios {result['speedup_range'][0]:.2f}-{result['speedup_range'][1]:.2f})"
    )
    lines.append(
        f"efficiency (optimized / ceiling, medians): {result['efficiency']:.2f} "
        f"(per-trial {result['efficiency_range'][0]:.2f}-{result['efficiency_range'][1]:.2f})"
    )
    for name, value in result.get("data_service", {}).items():
        lines.append(f"{name} / local optimized (median of per-round ratios): {value:.2f}")
    lines += feeding_lines(result)
    return "\n".join(lines)


def feeding_lines(result: dict) -> list[str]:
    """How many host cores each pipeline needs to keep the device (the ceiling) fed."""
    ceiling = result["variants"]["ceiling"]["median"]
    lines = []
    for name, cost in result.get("pipeline_cost", {}).items():
        per_thousand = cost["core_seconds_per_example"] * 1000
        lines.append(
            f"{name} pipeline alone: {cost['examples_per_sec_alone']:,.0f} ex/s, {per_thousand:.2g} cores per 1,000 "
            f"images/s; the device eats {ceiling:,.0f}/s: {cost['cores_to_feed_device']:.2g} cores "
            f"(this host has {result['host_cores']}); memory +{cost['memory_growth_mb']:,.0f} MB"
        )
    if result.get("peak_rss_mb"):
        lines.append(f"peak RSS of this benchmark process (every variant): {result['peak_rss_mb']:,.0f} MB")
    return lines


def main(args) -> int:
    scenario = scenario_lib.resolve(args.scenario)
    out = Path(args.out)
    configs = {
        name: scenario.load(path, args.overrides, name=name)
        for name, path in (("naive", args.naive), ("optimized", args.optimized))
    }
    spec, found = trials.begin(scenario, list(configs.values()), out)
    print(
        f"Device: {found.describe()}. {args.trials} interleaved trials of >= {args.seconds:g} s per variant, "
        "after warm-up.",
        flush=True,
    )
    variants = [
        trials.prepare("naive", configs["naive"], spec, found),
        trials.prepare("optimized", configs["optimized"], spec, found),
        trials.prepare("ceiling", configs["optimized"], spec, found, ceiling=True),
    ]
    trials.interleaved(variants, args.trials, args.seconds)
    by_name = {v.name: v for v in variants}
    speedups = trials.paired_ratios(by_name["optimized"], by_name["naive"])
    efficiencies = trials.paired_ratios(by_name["optimized"], by_name["ceiling"])
    stats = {v.name: _stats(v) for v in variants}
    service_ratios = {}
    if args.data_service_workers:
        # A second round, so that service workers refilling their buffers in the background
        # never run during the trials of the three variants above. The optimized pipeline on
        # tf.data service workers (in this process, on this machine) against the local one: what
        # the service costs (every batch crosses gRPC) and buys (preprocessing on more cores).
        print("Data-service variants, against the local optimized pipeline:", flush=True)
        local = by_name["optimized"]
        first_round, local.samples = local.samples, []
        served, clusters = [local], []
        try:
            for workers in args.data_service_workers:
                cluster = service.LocalCluster(workers)
                clusters.append(cluster)
                cfg = scenario.load(
                    args.optimized,
                    list(args.overrides) + [f"pipeline.data_service={cluster.target}"],
                    name=f"service_{workers}w",
                )
                served.append(trials.prepare(f"service_{workers}w", cfg, spec, found))
            trials.interleaved(served, args.trials, args.seconds)
        finally:
            for variant in served[1:]:
                variant.iterator = None  # releases its service job while the dispatcher still answers
            gc.collect()
            for cluster in clusters:
                cluster.stop()
        for variant in served[1:]:
            stats[variant.name] = _stats(variant)
            service_ratios[variant.name] = statistics.median(trials.paired_ratios(variant, local))
        local.samples = first_round
        variants += served[1:]
    for variant in variants:
        variant.iterator = None  # stops their prefetching: the pipelines are measured alone below
    gc.collect()
    costs = {}
    for name in ("naive", "optimized"):
        cost = trials.pipeline_cost(configs[name], spec, found)
        cost["cores_to_feed_device"] = cost["core_seconds_per_example"] * stats["ceiling"]["median"]
        costs[name] = cost
    result = {
        "device": found.describe(),
        "host_cores": found.cpu_cores,
        "pipeline_cost": costs,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "scenario": scenario.why,
        "model": configs["optimized"].model.name,
        "image_shape": list(spec.image_shape),
        "trials": args.trials,
        "trial_seconds": args.seconds,
        "variants": stats,
        "speedup": ratio(stats["optimized"], stats["naive"]),
        "speedup_range": [min(speedups), max(speedups)],
        "efficiency": ratio(stats["optimized"], stats["ceiling"]),
        "efficiency_range": [min(efficiencies), max(efficiencies)],
        "data_service": service_ratios,  # median of per-round ratios service / local optimized
    }
    files.write_json(out / "bench.json", result)
    write_tensorboard(out, variants)
    print()
    print(table(result))
    print(f"\nWritten: {out}/bench.json (TensorBoard: runs bench/tb/*)")
    return 0
