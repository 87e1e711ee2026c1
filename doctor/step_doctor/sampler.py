"""Background sampling of GPU utilization (NVML, via nvidia-ml-py) and CPU utilization (psutil).

NVML's "GPU utilization" is the percent of the last sample period (1/6 s to 1 s) in which
any kernel ran on the GPU: one tiny kernel at a time reads 100 %. Where the GPU offers
NVML's GPM metrics (Hopper and newer) the sampler also records, between consecutive
samples, SM activity (the share of SMs busy), SM occupancy (active warps against the
maximum) and tensor-core activity: they tell a busy GPU from a trickle of small kernels.

Where there is no GPU, no NVML library, or no GPM support (older GPUs, no permission) the
sampler records the figure as unavailable (None) with the reason; it never invents a number.

Neither Keras nor TensorFlow is imported here: `step-doctor profile` samples around a child
process and writes the samples as TensorBoard scalars (`SampleWriter`, TensorBoard's own record
writer and protos) without paying TensorFlow's import. The Keras callback is in monitor.py.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import psutil

GPM_METRICS = (  # (key in a sample, the metric's name in nvidia-ml-py)
    ("sm_activity_percent", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy_percent", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_activity_percent", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
)
GPM_KEYS = tuple(key for key, _ in GPM_METRICS)
GPU_KEYS = ("utilization_percent", "memory_used_mb", "power_w", *GPM_KEYS)


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


def nvml_reason() -> str:
    """Why NVML cannot be used here ("" where a driver answers)."""
    nvml, reason = _load_nvml()
    if nvml is not None:
        nvml.nvmlShutdown()
    return reason


def _gpm_reason(nvml, error: Exception) -> str:
    """Why a GPU gives no GPM metrics, from the binding's error class."""
    if isinstance(error, getattr(nvml, "NVMLError_NotSupported", ())):
        return "NVML GPM metrics are not supported on this GPU (Hopper or newer needed)"
    if isinstance(error, getattr(nvml, "NVMLError_NoPermission", ())):
        return "no permission to read NVML GPM metrics"
    if isinstance(error, getattr(nvml, "NVMLError_FunctionNotFound", ())):
        return "the driver's NVML has no GPM functions (driver too old)"
    return f"NVML GPM failed: {error}"


class GpmReader:
    """SM activity, SM occupancy and tensor-core activity of one GPU between consecutive reads.

    NVML's GPM metrics are computed from two samples: each read takes a new sample and
    compares it with the previous one, so the first read has no figures yet.
    """

    def __init__(self, nvml, handle):
        self.nvml = nvml
        self.handle = handle
        self.reason: str | None = None
        self._samples: list = []  # [previous, current]
        self._have_previous = False
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            self.reason = (
                "this pynvml has no GPM functions (an old `pynvml` package shadows nvidia-ml-py's module; "
                "pip install --force-reinstall nvidia-ml-py)"
            )
            return
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                self.reason = "NVML GPM metrics are not supported on this GPU (Hopper or newer needed)"
                return
            self._samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        except nvml.NVMLError as error:
            self.reason = _gpm_reason(nvml, error)
            self.close()

    def read(self) -> dict:
        """{key: percent or None} since the previous read."""
        empty = dict.fromkeys(GPM_KEYS)
        if self.reason is not None:
            return empty
        nvml = self.nvml
        previous, current = self._samples
        try:
            nvml.nvmlGpmSampleGet(self.handle, current)
        except nvml.NVMLError as error:
            if not isinstance(error, getattr(nvml, "NVMLError_Timeout", ())):  # anything but a transient failure
                self.reason = _gpm_reason(nvml, error)
                self.close()
            return empty
        self._samples.reverse()  # this sample is the previous one of the next read
        if not self._have_previous:
            self._have_previous = True
            return empty
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = previous, current
        for index, (_, name) in enumerate(GPM_METRICS):
            request.metrics[index].metricId = getattr(nvml, name)
        try:
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError:
            return empty
        return {
            key: float(request.metrics[index].value) if request.metrics[index].nvmlReturn == nvml.NVML_SUCCESS else None
            for index, key in enumerate(GPM_KEYS)
        }

    def close(self) -> None:
        for sample in self._samples:
            try:
                self.nvml.nvmlGpmSampleFree(sample)
            except self.nvml.NVMLError:
                pass
        self._samples = []


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
        self.gpm = [GpmReader(nvml, handle) for handle in self.handles]
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process = psutil.Process()

    @property
    def gpu_available(self) -> bool:
        return bool(self.handles)

    @property
    def gpm_unavailable_reason(self) -> str | None:
        """Why SM/tensor-core activity is missing (None when every GPU reports it)."""
        if not self.handles:
            return self.gpu_unavailable_reason
        by_reason: dict[str, list[str]] = {}
        for index, reader in enumerate(self.gpm):
            if reader.reason is not None:
                by_reason.setdefault(reader.reason, []).append(str(index))
        if not by_reason:
            return None
        return "; ".join(
            f"GPU {', '.join(indices)} ({self.gpu_names[int(indices[0])]}): {reason}"
            for reason, indices in by_reason.items()
        )

    def sample(self) -> dict:
        row = {"time": time.time(), "cpu_percent": psutil.cpu_percent(interval=None), "gpus": []}
        for handle, gpm in zip(self.handles, self.gpm):
            gpu = {"utilization_percent": None, "memory_used_mb": None, "power_w": None, **gpm.read()}
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
        for reader in self.gpm:
            reader.read()  # the first GPM sample: the thread's first row then has an interval
        self._thread = threading.Thread(target=self._run, name="utilization-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        for reader in self.gpm:
            reader.close()
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass

    def summary(self, since: float = 0.0, until: float | None = None) -> dict:
        """mean/p50/p95 of each series over the samples taken between `since` and `until` (all when none is)."""
        rows = [r for r in self.samples if r["time"] >= since and (until is None or r["time"] <= until)]
        rows = rows or self.samples
        result = {
            "samples": len(rows),
            "interval_s": self.interval_s,
            "cpu_utilization_percent": _stats([r["cpu_percent"] for r in rows]),
            "gpu_available": self.gpu_available,
            "gpu_unavailable_reason": None if self.gpu_available else self.gpu_unavailable_reason,
            "gpm_unavailable_reason": self.gpm_unavailable_reason,
            "gpus": [],
        }
        for index, name in enumerate(self.gpu_names):
            series = {
                key: [r["gpus"][index][key] for r in rows if r["gpus"][index].get(key) is not None] for key in GPU_KEYS
            }
            result["gpus"].append(
                {
                    "index": index,
                    "name": name,
                    **{k: _stats(v) for k, v in series.items()},
                    "gpm_unavailable_reason": self.gpm[index].reason,
                }
            )
        # Means over the GPUs that report the figure; None (never 0) where none does.
        for key, gpu_key in [("gpu_utilization_percent", "utilization_percent"), *zip(GPM_KEYS, GPM_KEYS)]:
            means = [g[gpu_key]["mean"] for g in result["gpus"] if g[gpu_key]]
            result[key] = statistics.fmean(means) if means else None
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


class SampleWriter:
    """Appends a sampler's rows to one TensorBoard run as scalars, without TensorFlow.

    TensorBoard's own EventFileWriter opens files through `tf.io.gfile`, which imports TensorFlow
    when it is installed; its RecordWriter and the event protos do not, so they write the file here.
    Tags: cpu_utilization_percent, gpu<i>/<key> (utilization_percent, memory_used_mb, power_w, GPM).
    """

    def __init__(self, logdir: Path, suffix: str = ".utilization"):
        import socket

        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event = event_pb2.Event
        logdir = Path(logdir)
        logdir.mkdir(parents=True, exist_ok=True)
        self.path = logdir / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}{suffix}"
        self._file = open(self.path, "wb")  # noqa: SIM115 (kept open while the run goes on)
        self._records = RecordWriter(self._file)
        self._records.write(self._event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        self.written = 0

    def write(self, rows: list[dict]) -> None:
        """Write the rows not written yet (`rows` is the sampler's growing list)."""
        for step, row in enumerate(rows[self.written :], start=self.written):
            event = self._event(wall_time=row["time"], step=step)
            event.summary.value.add(tag="cpu_utilization_percent", simple_value=row["cpu_percent"])
            for index, gpu in enumerate(row["gpus"]):
                for key, value in gpu.items():
                    if value is not None:
                        event.summary.value.add(tag=f"gpu{index}/{key}", simple_value=value)
            self._records.write(event.SerializeToString())
        self.written = max(self.written, len(rows))
        self._file.flush()

    def close(self) -> None:
        self._file.close()
