"""`make sweep-batch`: throughput and utilization against batch size, and the largest that fits.

Batch sizes double from --min until --max, the size of the training split, or the first
out-of-memory error. Each point is the optimized preset (plus the scenario overlay) with
that batch size: repeated trials after warm-up, CPU/GPU utilization sampled during them,
and the input-bound share from a short profile. The largest batch that fit is written to
runs/sweep-batch/sweep.json, where an out-of-memory error in `fit` looks for it.

The workload says which knob a batch size sets (`Workload.batch_override`; text: B texts of the
longest length, text.pipeline.token_budget = B x data.max_length where the batches are bucketed
or packed) and what the rates count (text: real tokens/s, padding left out).
"""

from __future__ import annotations

import gc
from pathlib import Path

from train import scenario as scenario_lib
from train import workloads
from train.benchmarks import charts, trials
from train.benchmarks.options import SweepOptions
from train.benchmarks.report_writer import ReportWriter
from train.core import files
from train.core.outputs import SWEEP_RESULT
from train.measure.monitor import Sampler
from train.training import plan


def _is_oom(error: Exception) -> bool:
    import tensorflow as tf

    return isinstance(error, tf.errors.ResourceExhaustedError) or "out of memory" in str(error).lower()


def knob(cfg, batch: int, spec) -> str:
    """The override that gives `cfg` a batch of `batch` (the workload's: text, `batch` texts of the longest length)."""
    return workloads.get(cfg.workload).batch_override(cfg, spec, batch)


def measure_batch(batch: int, cfg, spec, found, opts: SweepOptions, out: Path) -> dict:
    """Trials, CPU/GPU utilization and a short profile of one batch size; an out-of-memory error is a point too."""
    sampler = Sampler(interval_s=0.2)
    try:
        variant = trials.prepare(f"batch {batch}", cfg, spec, found)
        sampler.start()
        for _ in range(opts.trials.rounds):
            variant.trial(opts.trials.seconds)
        sampler.stop()
        profile = variant.profile(out / "profiles" / f"batch_{batch}", num_steps=6)
    except Exception as error:  # only an out-of-memory error ends the sweep quietly
        sampler.stop()
        if not _is_oom(error):
            raise
        print(f"  batch {batch}: out of memory", flush=True)
        return {"batch_size": batch, "status": "out of memory"}
    usage = sampler.summary()
    rates = variant.stats()
    print(
        f"  batch {batch}: {rates['median']:,.0f} {variant.unit} ({rates['min']:,.0f}-{rates['max']:,.0f})"
        + (f", {profile['input_bound_percent']:.1f}% waiting for input" if profile else ""),
        flush=True,
    )
    del variant
    gc.collect()
    return {
        "batch_size": batch,
        "status": "ok",
        "examples_per_sec": rates,
        "input_bound_percent": profile["input_bound_percent"] if profile else None,
        "device_busy_percent": profile["device_busy_percent"] if profile else None,
        "cpu_utilization_percent": (usage["cpu_utilization_percent"] or {}).get("mean"),
        "gpu_utilization_percent": usage["gpu_utilization_percent"],
    }


def main(opts: SweepOptions) -> int:
    scenario = scenario_lib.for_preset(opts.variants.scenario, opts.variants.optimized)
    base = scenario.load(opts.variants.optimized, list(opts.variants.overrides), name="sweep")
    out = Path(opts.out)
    spec, found = trials.begin(scenario, [base], out, clean=True)
    sizes, size = [], opts.min_batch
    while size <= opts.max_batch:
        sizes.append(size)
        size *= 2
    print(
        f"Device: {found.describe()}. Batch sizes {sizes[0]}..{sizes[-1]}, {opts.trials.rounds} trials of "
        f">= {opts.trials.seconds:g} s each after warm-up.",
        flush=True,
    )

    points, largest, stop_reason = [], None, f"reached --max {opts.max_batch}"
    replicas = plan.make_strategy(plan.resolve(base, found, spec)[0]).num_replicas_in_sync
    for batch in sizes:
        if batch * replicas > spec.num_train:
            stop_reason = (
                f"batch {batch} per replica x {replicas} is larger than the training split ({spec.num_train} examples)"
            )
            break
        cfg = scenario.load(
            opts.variants.optimized,
            list(opts.variants.overrides) + [knob(base, batch, spec)],
            name=f"batch_{batch}",
        )
        point = measure_batch(batch, cfg, spec, found, opts, out)
        points.append(point)
        if point["status"] != "ok":
            stop_reason = f"batch {batch} ran out of memory"
            break
        largest = batch

    workload = workloads.get(base.workload)
    ok = [p for p in points if p["status"] == "ok"]
    best = max(ok, key=lambda p: p["examples_per_sec"]["median"]) if ok else None
    result = {
        "device": found.describe(),
        "scenario": scenario.why,
        "workload": workload.name,
        "unit": workload.unit.label,  # of examples_per_sec, below
        "knob": knob(base, 1, spec).split("=")[0],
        "model": base.model.name,
        **workload.shape_facts(spec),
        "points": points,
        "largest_batch_that_fit": largest,
        "stopped_because": stop_reason,
        "fastest_batch": best and best["batch_size"],
    }
    WRITER.write(out, result)
    write_tensorboard(out, ok)
    print(f"\nLargest batch that fit: {largest} ({stop_reason}); fastest: {result['fastest_batch']}.")
    print(f"Written: {out}/sweep.json, {out}/sweep.png (TensorBoard: run sweep-batch/tb)")
    return 0


def table(result: dict) -> str:
    """The batch sizes tried and what each measured, in the result's unit."""
    lines = [f"{'batch':>7} {result.get('unit') or 'examples/s':>16} {'status':>8}"]
    for point in result["points"]:
        rate = (point.get("examples_per_sec") or {}).get("median")
        lines.append(f"{point['batch_size']:>7} {f'{rate:,.0f}' if rate else 'n/a':>16} {point['status']:>8}")
    return "\n".join(lines)


def chart(result: dict, path: Path) -> None:
    plt = charts.pyplot()
    ok = [p for p in result["points"] if p["status"] == "ok"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4))
    xs = [p["batch_size"] for p in ok]
    medians = [p["examples_per_sec"]["median"] for p in ok]
    lows = [m - p["examples_per_sec"]["min"] for m, p in zip(medians, ok)]
    highs = [p["examples_per_sec"]["max"] - m for m, p in zip(medians, ok)]
    left.errorbar(xs, medians, yerr=[lows, highs], fmt="o-", capsize=3)
    left.set_xscale("log", base=2)
    batch_label = workloads.of_record(result).batch_label
    left.set_xlabel(batch_label)
    left.set_ylabel(f"{result.get('unit', 'examples/s')} (median, min-max)")
    left.set_title(f"Throughput - largest batch that fit: {result['largest_batch_that_fit']}")
    for key, label in (
        ("input_bound_percent", "waiting for input (profiler)"),
        ("gpu_utilization_percent", "GPU utilization (NVML)"),
        ("cpu_utilization_percent", "CPU utilization"),
    ):
        values = [(p["batch_size"], p[key]) for p in ok if p[key] is not None]
        if values:
            right.plot(*zip(*values), "o-", label=label)
    right.set_xscale("log", base=2)
    right.set_ylim(0, 105)
    right.set_xlabel(batch_label)
    right.set_ylabel("% of time")
    right.set_title("Utilization")
    right.legend(fontsize=8)
    fig.suptitle(f"{result['device']} - model {result['model']}", fontsize=9)
    fig.tight_layout()
    charts.save(fig, path)


def write_tensorboard(out: Path, points: list[dict]) -> None:
    keys = ("input_bound_percent", "cpu_utilization_percent", "gpu_utilization_percent")
    files.write_scalars(
        out / "tb",
        [
            (
                f"sweep/{key}",
                point["examples_per_sec"]["median"] if key == "examples_per_sec" else point[key],
                point["batch_size"],
            )
            for point in points
            for key in ("examples_per_sec", *keys)
        ],
    )


WRITER = ReportWriter(SWEEP_RESULT.removesuffix(".json"), table=table, chart=chart)
