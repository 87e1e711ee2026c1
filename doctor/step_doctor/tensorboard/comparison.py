"""A compare folder (report.json beside its runs) as the tab shows it: the runs side by side.

report.json is written by the template's `compare` (train/benchmarks/report.py); the tab reads it
as data and imports nothing of the template. Its rows name each run (naive, optimized); a row is
linked to the run the tab found at <folder>/<row name>, never to the `run_dir` the report
recorded, which names a folder on the machine that wrote it.
"""

from __future__ import annotations

import json

from step_doctor.tensorboard.discovery import CompareFolder, Listing

ROWS = (  # (label, key in the report's row, decimals, unit): the figures compare's own table shows
    ("examples/s", "examples_per_sec", 0, ""),
    ("step time", "step_time_ms", 1, " ms"),
    ("waiting for input (profiler)", "input_bound_percent", 1, " %"),
    ("device busy (profiler)", "device_busy_percent", 1, " %"),
    ("GPU utilization (NVML)", "gpu_utilization_percent", 1, " %"),
    ("SM activity (NVML GPM)", "sm_activity_percent", 1, " %"),
    ("SM occupancy (NVML GPM)", "sm_occupancy_percent", 1, " %"),
    ("tensor-core activity (NVML GPM)", "tensor_activity_percent", 1, " %"),
    ("CPU utilization", "cpu_utilization_percent", 1, " %"),
    ("validation accuracy", "val_accuracy", 3, ""),
    ("batch size", "batch_size", 0, ""),
    ("precision", "precision", 0, ""),
    ("slowest tf.data stage", "slow_stage", 0, ""),
    ("pipeline", "pipeline", 0, ""),
)


class ReportError(ValueError):
    pass


def _cell(value, digits: int, unit: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:,.{digits}f}{unit}"


def read(folder: CompareFolder, listing: Listing) -> dict:
    """{"folder", "device", "scenario", "speedup", "names", "rows": [[label, cells...]], "runs": {name: run}, ...}."""
    try:
        report = json.loads(folder.report.read_text())
    except (OSError, ValueError) as error:
        raise ReportError(f"{folder.name}/report.json cannot be read: {error}") from None
    runs = report.get("runs") if isinstance(report, dict) else None
    if not isinstance(runs, dict) or not runs:
        raise ReportError(f"{folder.name}/report.json names no runs")
    names = list(runs)
    prefix = "" if folder.name == "." else f"{folder.name}/"
    rows = [
        [label] + [_cell((runs[n] or {}).get(key), digits, unit) for n in names] for label, key, digits, unit in ROWS
    ]
    notes = sorted({runs[n].get("gpu_unavailable_reason") for n in names if isinstance(runs[n], dict)} - {None, ""})
    return {
        "folder": folder.name,
        "device": report.get("device"),
        "scenario": report.get("scenario"),
        "model": report.get("model"),
        "speedup": report.get("speedup"),
        "baseline": names[0],
        "target": names[-1],
        "names": names,
        "rows": rows,
        "gpu_notes": notes,
        "image": folder.image is not None,
        "runs": {n: (prefix + n if prefix + n in listing.runs else None) for n in names},
    }
