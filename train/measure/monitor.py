"""Background sampling of GPU utilization (NVML, via nvidia-ml-py) and CPU utilization (psutil).

NVML's "GPU utilization" is the percent of the last sample period (1/6 s to 1 s) in which
any kernel ran on the GPU: a busy GPU reads near 100 %, a starved one near 0 %. It is not
SM occupancy. Where there is no GPU or no NVML library the sampler says so once and
records GPU figures as unavailable (None); it never invents a number.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import keras
import psutil


def _load_nvml():
    """The real NVML binding, initialised, or (None, reason)."""
    try:
        import pynvml
    except ImportError as error:
        return None, f"nvidia-ml-py is not installed ({error})"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return None, f"NVML is unavailable: {error}"
    return pynvml, ""


class Sampler:
    """Samples every `interval_s` seconds in a daemon thread until `stop()`."""

    def __init__(self, interval_s: float = 0.5, nvml=None, nvml_reason: str = ""):
        self.interval_s = interval_s
        if nvml is None and not nvml_reason:
            nvml, nvml_reason = _load_nvml()
        self.nvml = nvml
        self.gpu_unavailable_reason = nvml_reason
        self.handles = []
        self.gpu_names: list[str] = []
        if nvml is not None:
            try:
                count = nvml.nvmlDeviceGetCount()
                self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
                self.gpu_names = [_text(nvml.nvmlDeviceGetName(h)) for h in self.handles]
            except nvml.NVMLError as error:
                self.handles, self.gpu_unavailable_reason = [], f"NVML could not list GPUs: {error}"
            if not self.handles and not self.gpu_unavailable_reason:
                self.gpu_unavailable_reason = "NVML found no GPU"
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process = psutil.Process()

    @property
    def gpu_available(self) -> bool:
        return bool(self.handles)

    def sample(self) -> dict:
        row = {"time": time.time(), "cpu_percent": psutil.cpu_percent(interval=None), "gpus": []}
        for handle in self.handles:
            gpu = {"utilization_percent": None, "memory_used_mb": None, "power_w": None}
            try:
                gpu["utilization_percent"] = float(self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                gpu["memory_used_mb"] = self.nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
            except self.nvml.NVMLError:
                pass
            try:
                gpu["power_w"] = self.nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            except self.nvml.NVMLError:
                pass  # some boards do not report power
            row["gpus"].append(gpu)
        return row

    def _run(self):
        while not self._stop.wait(self.interval_s):
            self.samples.append(self.sample())

    def start(self) -> None:
        psutil.cpu_percent(interval=None)  # the first call only sets the reference point
        self._thread = threading.Thread(target=self._run, name="utilization-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass

    def summary(self, since: float = 0.0) -> dict:
        """mean/p50/p95 of each series over the samples taken after `since`."""
        rows = [r for r in self.samples if r["time"] >= since] or self.samples
        result = {
            "samples": len(rows),
            "interval_s": self.interval_s,
            "cpu_utilization_percent": _stats([r["cpu_percent"] for r in rows]),
            "gpu_available": self.gpu_available,
            "gpu_unavailable_reason": None if self.gpu_available else self.gpu_unavailable_reason,
            "gpus": [],
        }
        for index, name in enumerate(self.gpu_names):
            series = {
                key: [r["gpus"][index][key] for r in rows if r["gpus"][index][key] is not None]
                for key in ("utilization_percent", "memory_used_mb", "power_w")
            }
            result["gpus"].append({"index": index, "name": name, **{k: _stats(v) for k, v in series.items()}})
        utilization = [g["utilization_percent"]["mean"] for g in result["gpus"] if g["utilization_percent"]]
        result["gpu_utilization_percent"] = statistics.fmean(utilization) if utilization else None
        return result


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _stats(values: list[float]) -> dict | None:
    if not values:
        return None
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"mean": statistics.fmean(ordered), "p50": pick(0.5), "p95": pick(0.95), "max": ordered[-1]}


class MonitorCallback(keras.callbacks.Callback):
    """Writes a running Sampler's samples as TensorBoard scalars (the caller starts and stops it)."""

    def __init__(self, sampler: Sampler, logdir: Path, log=print):
        super().__init__()
        self.sampler = sampler
        self.logdir = logdir
        self.log = log
        self._written = 0
        self._writer = None

    def on_train_begin(self, logs=None):
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(str(self.logdir), filename_suffix=".monitor")
            if not self.sampler.gpu_available:
                self.log(f"GPU utilization: unavailable ({self.sampler.gpu_unavailable_reason}); sampling CPU only.")

    def on_epoch_end(self, epoch, logs=None):
        self._write()

    def on_train_end(self, logs=None):
        self._write()

    def _write(self):
        import tensorflow as tf

        rows = self.sampler.samples[self._written :]
        if not rows:
            return
        with self._writer.as_default():
            for index, row in enumerate(rows, start=self._written):
                tf.summary.scalar("cpu_utilization_percent", row["cpu_percent"], step=index)
                for gpu_index, gpu in enumerate(row["gpus"]):
                    for key, value in gpu.items():
                        if value is not None:
                            tf.summary.scalar(f"gpu{gpu_index}/{key}", value, step=index)
        self._writer.flush()
        self._written += len(rows)
