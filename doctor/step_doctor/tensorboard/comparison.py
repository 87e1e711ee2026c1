"""A compare folder (report.json beside its runs) as the tab shows it: the runs side by side.

report.json is written by the template's `compare` (train/benchmarks/report.py); the tab reads it
as data and imports nothing of the template. Its rows name each run (naive, optimized); a row is
linked to the run the tab found at <folder>/<row name>, never to the `run_dir` the report
recorded, which names a folder on the machine that wrote it.
"""

from __future__ import annotations

import json

from step_doctor import compare_rows
from step_doctor.tensorboard.discovery import CompareFolder, Listing

ROWS = (*compare_rows.ROWS, compare_rows.SLOWEST_STAGE, compare_rows.PIPELINE)  # as compare's table, and more


class ReportError(ValueError):
    pass


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
        [label] + [compare_rows.cell((runs[n] or {}).get(key), digits, unit) for n in names]
        for label, key, digits, unit in ROWS
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
