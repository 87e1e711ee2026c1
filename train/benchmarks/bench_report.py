"""What `make bench` prints and writes besides bench.json: rows, the table, TensorBoard, the snapshot's cost."""

from __future__ import annotations

from pathlib import Path

from train import workloads
from train.benchmarks.report_writer import ReportWriter
from train.core import files


def row(variant) -> dict:
    facts = variant.facts
    return {
        **variant.stats(),
        "batch_size": facts.batch_size,
        "pipeline": facts.description,
        "precision": facts.precision,
        "jit_compile": facts.jit_compile,
        "steps_per_execution": facts.steps_per_execution,
        "warmup_seconds": facts.warmup_seconds,
        "prepare_seconds": variant.prepare_seconds,
    }


def write_tensorboard(out: Path, variants, tag: str = "bench/examples_per_sec") -> None:
    """Every trial as a scalar, one TensorBoard run per variant (runs bench/tb/<variant>)."""
    for variant in variants:
        files.write_scalars(
            out / "tb" / variant.name, [(tag, rate, index) for index, rate in enumerate(variant.samples)]
        )


def snapshot_size(snapshot: dict) -> dict:
    total = sum(path.stat().st_size for path in Path(snapshot["folder"]).rglob("*") if path.is_file())
    return {"disk_mb": total / 2**20}


def _gain_line(label: str, gain: dict, digits: int = 2) -> str:
    return (
        f"{label}: {gain['median']:.{digits}f} (median of {len(gain['ratios'])} per-round ratios; quartiles "
        f"{gain['q1']:.{digits}f}-{gain['q3']:.{digits}f}, range {gain['min']:.{digits}f}-{gain['max']:.{digits}f})"
    )


def table(result: dict) -> str:
    workload = workloads.of_record(result)
    rate = workload.unit.short
    lines = [f"{'variant':<17}{'median ' + rate:>13}{'min':>10}{'max':>10}  batch  pipeline"]
    for name, item in result["variants"].items():
        lines.append(
            f"{name:<17}{item['median']:>13,.0f}{item['min']:>10,.0f}{item['max']:>10,.0f}  "
            f"{item['batch_size']:>5}  {item['pipeline']}"
        )
    lines.append(_gain_line("speedup (optimized / naive)", result["speedup_gain"]))
    lines.append(_gain_line("efficiency (optimized / ceiling)", result["efficiency_gain"]))
    aa = result["aa"]
    lines.append(
        f"A/A (optimized measured twice a round): x{aa['median']:.3f} (quartiles {aa['q1']:.3f}-{aa['q3']:.3f}); "
        f"noise {result['noise']:.3f}"
    )
    for name, value in result.get("data_service", {}).items():
        lines.append(f"{name} / local optimized (median of per-round ratios): {value:.2f}")
    if result.get("snapshot"):
        lines.append(snapshot_line(result["snapshot"]))
    return "\n".join(lines + [""] + workload.cost_lines(result))


def markdown(result: dict) -> str:
    """bench.md: what was measured, how, and the table as printed."""
    return "\n".join(
        [
            "# make bench",
            "",
            f"Device: **{result['device']}**. {result['scenario']}. {result['trials']} interleaved rounds of at least "
            f"{result['trial_seconds']:g} s per variant after warm-up; {result['isolation']}. Gains are medians of "
            f"per-round ratios (train/benchmarks/stats.py); {_alone(result)} measured alone, each in a fresh "
            f"process. Rates are {result.get('unit', 'examples/s')}.",
            "",
            "```",
            table(result),
            "```",
            "",
        ]
    )


def snapshot_line(snapshot: dict) -> str:
    how = (
        "reused from an earlier run"
        if snapshot["reused"]
        else f"written during the first epoch (warm-up {snapshot['first_epoch_seconds']:.1f} s)"
    )
    line = f"cache: disk: a {snapshot['disk_mb']:,.0f} MB decoded snapshot in {snapshot['folder']}, {how}"
    if snapshot.get("gain"):
        gain = snapshot["gain"]
        line += (
            f"; optimized / without_snapshot (what auto takes without a cache folder): x{gain['median']:.2f} "
            f"(quartiles {gain['q1']:.2f}-{gain['q3']:.2f})"
        )
    return line


def _alone(result: dict) -> str:
    return (
        "the decode floor and each pipeline's cost were" if result.get("decode_floor") else "each pipeline's cost was"
    )


WRITER = ReportWriter("bench", table=table, markdown=markdown)
