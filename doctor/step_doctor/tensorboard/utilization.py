"""The utilization the sampler recorded around a run, as a few short series for the tab's chart.

The sampler (step_doctor/sampler.py, SampleWriter) writes TensorBoard scalars: the template's runs
into <run>/system/, `step-doctor profile` into <logdir>/utilization/ for the whole command. The
events are read with TensorBoard's own record reader in its TensorFlow-free form (the one its
event loader falls back to without TensorFlow), so the tab never imports TensorFlow for them.
Where a run recorded no events, its summary.json's `utilization` block gives the means.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from step_doctor.tensorboard.discovery import regular_file

FOLDERS = ("system", "utilization")
MAX_POINTS = 240  # per series: enough for a chart a few hundred pixels wide
MAX_BYTES = 32_000_000  # the reader checks CRCs in Python (about 2 MB/s): a longer record is cut short
# tag -> the series it joins; a machine's GPUs are averaged into one line each
SERIES = (
    (re.compile(r"^cpu_utilization_percent$"), "CPU"),
    (re.compile(r"^gpu\d+/utilization_percent$"), "GPU (NVML)"),
    (re.compile(r"^gpu\d+/sm_activity_percent$"), "SM activity (GPM)"),
)


def event_files(run_folder: Path, root: Path) -> list[Path]:
    """The nearest system/ or utilization/ event files: the run's own, else those of a folder above it."""
    folder = run_folder
    while True:
        for name in FOLDERS:
            candidate = folder / name
            if candidate.is_dir() and not candidate.is_symlink():
                found = sorted(p for p in candidate.glob("events.out.tfevents.*") if regular_file(p))
                if found:
                    return found
        if folder == root or root not in folder.parents:
            return []
        folder = folder.parent


def _records(path: Path, budget: int):
    """Each record's bytes, until the file ends, a record is damaged or cut short, or `budget` bytes are read."""
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

    reader = PyRecordReader_New(str(path))
    read = 0
    try:
        while read < budget:
            try:
                reader.GetNext()
            except (errors.OutOfRangeError, errors.DataLossError):  # the end, or a run still writing its last record
                return
            record = reader.record()
            read += len(record) + 16
            yield record
    finally:
        reader.file_handle.close()


def _samples(files: list[Path]) -> dict[str, dict[float, list[float]]]:
    """{series: {wall time: values}} from the events' scalar values."""
    from tensorboard.compat.proto import event_pb2

    found: dict[str, dict[float, list[float]]] = {}
    budget = MAX_BYTES
    for path in files:
        for record in _records(path, budget):
            budget -= len(record) + 16
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                name = next((label for pattern, label in SERIES if pattern.match(value.tag)), None)
                if name is not None and value.WhichOneof("value") == "simple_value":
                    found.setdefault(name, {}).setdefault(event.wall_time, []).append(value.simple_value)
    return found


def _thinned(points: list[tuple[float, float]]) -> list[list[float]]:
    """At most MAX_POINTS points, each the mean of a run of neighbours."""
    size = max(1, -(-len(points) // MAX_POINTS))
    out = []
    for start in range(0, len(points), size):
        chunk = points[start : start + size]
        out.append([round(sum(t for t, _ in chunk) / len(chunk), 3), round(sum(v for _, v in chunk) / len(chunk), 2)])
    return out


def series(files: list[Path], root: Path) -> dict | None:
    """{"source", "seconds", "series": [{"name", "mean", "points": [[seconds from start, percent]]}]}."""
    found = _samples(files)
    if not found:
        return None
    start = min(min(times) for times in found.values())
    end = max(max(times) for times in found.values())
    lines = []
    for name in (label for _, label in SERIES):
        if name not in found:
            continue
        points = sorted((t - start, sum(v) / len(v)) for t, v in found[name].items())
        lines.append(
            {
                "name": name,
                "mean": round(sum(v for _, v in points) / len(points), 1),
                "points": _thinned(points),
            }
        )
    return {
        "source": files[0].parent.relative_to(root).as_posix(),
        "seconds": round(end - start, 2),
        "series": lines,
    }


def recorded_means(run_folder: Path) -> dict | None:
    """The means summary.json recorded (the template's runs), with why GPU figures are missing."""
    path = run_folder / "summary.json"
    if not regular_file(path):
        return None
    try:
        usage = json.loads(path.read_text()).get("utilization") or None
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(usage, dict):
        return None
    cpu = usage.get("cpu_utilization_percent")
    return {
        "CPU": cpu.get("mean") if isinstance(cpu, dict) else cpu,
        "GPU (NVML)": usage.get("gpu_utilization_percent"),
        "SM activity (GPM)": usage.get("sm_activity_percent"),
        "gpu_unavailable_reason": usage.get("gpu_unavailable_reason"),
        "gpm_unavailable_reason": usage.get("gpm_unavailable_reason"),
    }


def of_run(run_folder: Path, root: Path) -> dict:
    """What the tab draws for a run: the recorded series, the summary's means, or neither."""
    files = event_files(run_folder, root)
    return {"events": series(files, root) if files else None, "summary": recorded_means(run_folder)}
