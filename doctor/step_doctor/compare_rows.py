"""The rows of a naive-vs-optimized comparison (compare's report.json), defined once: the template's compare report
(train/benchmarks/report.py) prints them, and the Diagnose tab's compare view (tensorboard/comparison.py) shows them.

Each row is (label, key in a run's entry of report.json, decimals, unit). The doctor reads report.json as data; the
template imports these rows from here (the template may import the doctor, never the other way)."""

from __future__ import annotations

ROWS = (
    ("examples/s", "examples_per_sec", 0, ""),
    ("step time (ms)", "step_time_ms", 1, ""),
    ("waiting for input (profiler)", "input_bound_percent", 1, " %"),
    ("device busy (profiler)", "device_busy_percent", 1, " %"),
    ("GPU utilization (NVML)", "gpu_utilization_percent", 1, " %"),
    ("SM activity (NVML GPM)", "sm_activity_percent", 1, " %"),
    ("SM occupancy (NVML GPM)", "sm_occupancy_percent", 1, " %"),
    ("tensor-core activity (NVML GPM)", "tensor_activity_percent", 1, " %"),
    ("CPU utilization (psutil)", "cpu_utilization_percent", 1, " %"),
    ("validation accuracy", "val_accuracy", 3, ""),
    ("batch size", "batch_size", 0, ""),
    ("precision", "precision", 0, ""),
)
SLOWEST_STAGE = ("slowest tf.data stage", "slow_stage", 0, "")
PIPELINE = ("pipeline", "pipeline", 0, "")


def cell(value, digits: int, unit: str) -> str:
    """One figure as the tables show it: n/a where it was not measured, never a made-up zero."""
    if value is None:
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{value}{unit}"
    return f"{value:,.{digits}f}{unit}"
