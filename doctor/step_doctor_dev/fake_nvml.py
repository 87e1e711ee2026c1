"""A fake NVML for machines without a GPU: tests of the sampler, and of anything that reports what it sampled.

It follows nvidia-ml-py's API: the same function names (a test checks them against the real module),
the binding's own structs, constants and error classes, and GPM samples that are opaque pointers
filled by nvmlGpmSampleGet and compared by nvmlGpmMetricsGet. Pass it as `Sampler(nvml=fake_nvml())`;
where a GPU exists the real binding is the default and this is never used.
"""

from __future__ import annotations

import ctypes
import itertools
import types

import pynvml

GPM_VALUES = {  # what the fake GPM GPU reports, by metric id
    pynvml.NVML_GPM_METRIC_SM_UTIL: 55.0,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 31.5,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 20.0,
}


def fake_nvml(utilization=(40, 90), power_fails=False, gpm="supported", gpm_values=GPM_VALUES):
    """A module with the slice of pynvml's API the sampler uses, for machines without a GPU.

    gpm: "supported" (a Hopper-class GPU), "unsupported" (isSupportedDevice 0, as on older GPUs),
    "no-permission" (nvmlGpmQueryDeviceSupport raises NVMLError_NoPermission) or "old-driver"
    (the driver's NVML lacks the function: NVMLError_FunctionNotFound).
    """
    handles = list(range(len(utilization)))
    state = types.SimpleNamespace(allocated=set(), freed=set(), metric_calls=0)

    def power(handle):
        if power_fails:
            raise pynvml.NVMLError_NotSupported()
        return 250_000  # milliwatts

    functions = dict(
        nvmlDeviceGetCount=lambda: len(handles),
        nvmlDeviceGetHandleByIndex=lambda index: handles[index],
        nvmlDeviceGetName=lambda handle: "NVIDIA H100 80GB HBM3" if gpm == "supported" else "Tesla T4",
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=utilization[handle], memory=10),
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=3 * 2**30, total=16 * 2**30),
        nvmlDeviceGetPowerUsage=power,
        nvmlShutdown=lambda: None,
        **_fake_gpm(gpm, gpm_values, state),
    )
    binding = {name: getattr(pynvml, name) for name in dir(pynvml) if name.startswith(("NVML", "c_nvml"))}
    module = types.SimpleNamespace(**binding, **functions)
    module.state = state
    return module


def _fake_gpm(gpm: str, gpm_values: dict, state) -> dict:
    """The GPM functions of fake_nvml: samples are opaque pointers, filled by nvmlGpmSampleGet (a tick each)
    and compared by nvmlGpmMetricsGet, which needs two of one GPU, the older first."""
    addresses = itertools.count(0x1000, 0x10)
    taken: dict[int, tuple[int, int]] = {}  # sample address -> (handle, tick)
    ticks = itertools.count(1)

    def query_support(handle):
        if gpm == "no-permission":
            raise pynvml.NVMLError_NoPermission()
        if gpm == "old-driver":
            raise pynvml.NVMLError_FunctionNotFound()
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpm == "supported")
        return support

    def address(sample) -> int:
        return ctypes.cast(sample, ctypes.c_void_p).value

    def sample_alloc():
        sample = ctypes.cast(ctypes.c_void_p(next(addresses)), pynvml.c_nvmlGpmSample_t)
        state.allocated.add(address(sample))
        return sample

    def sample_free(sample):
        state.freed.add(address(sample))

    def sample_get(handle, sample):
        if gpm != "supported":
            raise pynvml.NVMLError_NotSupported()
        if address(sample) not in state.allocated - state.freed:
            raise pynvml.NVMLError_InvalidArgument()
        taken[address(sample)] = (handle, next(ticks))
        return sample

    def metrics_get(request):
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        first, second = taken.get(address(request.sample1)), taken.get(address(request.sample2))
        if not first or not second or first[0] != second[0] or first[1] >= second[1]:
            raise pynvml.NVMLError_InvalidArgument()  # two samples of one GPU, the older one first
        state.metric_calls += 1
        for index in range(request.numMetrics):
            metric = request.metrics[index]
            if metric.metricId in gpm_values:
                metric.value = gpm_values[metric.metricId] + 10 * first[0]  # GPU 1 reads 10 points higher
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

    return dict(
        nvmlGpmQueryDeviceSupport=query_support,
        nvmlGpmSampleAlloc=sample_alloc,
        nvmlGpmSampleFree=sample_free,
        nvmlGpmSampleGet=sample_get,
        nvmlGpmMetricsGet=metrics_get,
    )


def skip_gpu_tests_without_a_driver(items) -> None:
    """The body of a pytest collection hook: skip the tests marked `gpu` where no NVIDIA driver answers."""
    import pytest

    from step_doctor.sampler import nvml_reason

    reason = nvml_reason()
    if not reason:
        return
    skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU with a working driver ({reason})")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
