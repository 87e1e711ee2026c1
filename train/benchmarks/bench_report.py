"""What `make bench` prints and writes besides bench.json: rows, the table, TensorBoard, the snapshot's cost."""

from __future__ import annotations

from pathlib import Path

from train.benchmarks import floor
from train.core import files
from train.input import pipeline


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


def write_tensorboard(out: Path, variants, text: bool = False) -> None:
    """Every trial as a scalar, one TensorBoard run per variant (runs bench/tb/<variant>)."""
    tag = "bench/real_tokens_per_sec" if text else "bench/examples_per_sec"
    for variant in variants:
        files.write_scalars(
            out / "tb" / variant.name, [(tag, rate, index) for index, rate in enumerate(variant.samples)]
        )


def snapshot_facts(knobs, spec) -> dict:
    """Where the decoded snapshot of a `cache: disk` pipeline lives, and whether an earlier run left it."""
    folder = pipeline.snapshot_dir(knobs, spec, training=True)
    return {
        "folder": str(folder),
        "reused": folder.is_dir() and any(folder.iterdir()),
        "expected_mb": pipeline.decoded_size_mb(spec, knobs, spec.num_train),
    }


def snapshot_size(snapshot: dict) -> dict:
    total = sum(path.stat().st_size for path in Path(snapshot["folder"]).rglob("*") if path.is_file())
    return {"disk_mb": total / 2**20}


def _gain_line(label: str, gain: dict, digits: int = 2) -> str:
    return (
        f"{label}: {gain['median']:.{digits}f} (median of {len(gain['ratios'])} per-round ratios; quartiles "
        f"{gain['q1']:.{digits}f}-{gain['q3']:.{digits}f}, range {gain['min']:.{digits}f}-{gain['max']:.{digits}f})"
    )


def table(result: dict) -> str:
    text = result.get("task") == "text"
    rate = "tokens/s" if text else "ex/s"
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
    return "\n".join(lines + [""] + (text_cost_lines(result) if text else cost_lines(result)))


def markdown(result: dict) -> str:
    """bench.md: what was measured, how, and the table as printed."""
    return "\n".join(
        [
            "# make bench",
            "",
            f"Device: **{result['device']}**. {result['scenario']}. {result['trials']} interleaved rounds of at least "
            f"{result['trial_seconds']:g} s per variant after warm-up; {result['isolation']}. Gains are medians of "
            f"per-round ratios (train/benchmarks/stats.py); {_alone(result)} measured alone, each in a fresh "
            "process." + (" Rates are real tokens/s: padding is not counted." if result.get("task") == "text" else ""),
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


def cost_lines(result: dict) -> list[str]:
    """The decode floor, each pipeline's CPU cost per image against it, and the cores that feeding takes."""
    floor_result = result["decode_floor"]
    ceiling = result["variants"]["ceiling"]["median"]
    per_image = floor_result["core_seconds_per_example"]
    lines = [
        f"Decode floor: {floor_result['decode']}, {floor_result['mean_record_kb']:.1f} KB per record, one thread: "
        f"{per_image * 1e3:.3f} core-ms per image ({floor_result['examples_per_sec_per_core']:,.0f} images/s per core)",
        f"{'pipeline alone':<17}{'ex/s alone':>11}{'core-ms/img':>13}{'x floor':>9}{'cores/1,000/s':>15}"
        f"  cores for {' / '.join(f'{rate:,}' for rate in floor.RATES)} images/s",
    ]
    needed = " / ".join(f"{value:.2g}" for value in floor_result["cores_needed"].values())
    lines.append(f"{'decode floor':<17}{'':>11}{per_image * 1e3:>13.3f}{1.0:>9.2f}{per_image * 1e3:>15.2g}  {needed}")
    for name, cost in result["pipeline_cost"].items():
        needed = " / ".join(f"{value:.2g}" for value in cost["cores_needed"].values())
        lines.append(
            f"{name:<17}{cost['examples_per_sec_alone']:>11,.0f}{cost['core_seconds_per_example'] * 1e3:>13.3f}"
            f"{cost['floor_multiple']:>9.2f}{cost['cores_per_1000']:>15.2g}  {needed}"
        )
    for name, cost in result["pipeline_cost"].items():
        lines.append(
            f"{name}: {cost['cores_per_1000']:.2g} cores per 1,000 images/s; the device here eats {ceiling:,.0f}/s: "
            f"{cost['cores_to_feed_device']:.2g} cores (this host has {result['host_cores']}); "
            f"memory +{cost['memory_growth_mb']:,.0f} MB"
        )
    lines.append(f"peak RSS of the largest variant's process: {result['peak_rss_mb']:,.0f} MB")
    return lines


def _alone(result: dict) -> str:
    return (
        "each pipeline's cost was" if result.get("task") == "text" else "the decode floor and each pipeline's cost were"
    )


def text_cost_lines(result: dict) -> list[str]:
    """Each text pipeline's CPU cost per real token, and the cores it takes to feed the model at its ceiling."""
    ceiling = result["variants"]["ceiling"]["median"]
    lines = [
        f"{'pipeline alone':<17}{'tokens/s alone':>15}{'texts/s alone':>15}{'core-us/token':>15}{'cores/100k/s':>14}"
    ]
    for name, cost in result["pipeline_cost"].items():
        lines.append(
            f"{name:<17}{cost['real_tokens_per_sec_alone']:>15,.0f}{cost['texts_per_sec_alone']:>15,.0f}"
            f"{cost['core_seconds_per_token'] * 1e6:>15.3f}{cost['cores_per_100k_tokens']:>14.2g}"
        )
    for name, cost in result["pipeline_cost"].items():
        lines.append(
            f"{name}: the model here eats {ceiling:,.0f} real tokens/s: {cost['cores_to_feed_device']:.2g} cores to "
            f"feed it (this host has {result['host_cores']}); memory +{cost['memory_growth_mb']:,.0f} MB"
        )
    lines.append(f"peak RSS of the largest variant's process: {result['peak_rss_mb']:,.0f} MB")
    return lines
