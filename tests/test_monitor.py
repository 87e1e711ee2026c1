"""The utilization sampler: its real NVML path is the default; a fake NVML stands in only where no GPU exists."""

import types

import pytest

from train.measure import monitor


class FakeNVMLError(Exception):
    pass


def fake_nvml(utilization=(40, 90), power_fails=False):
    """An object with the slice of pynvml's API the sampler uses, for machines without a GPU."""
    handles = list(range(len(utilization)))

    def power(handle):
        if power_fails:
            raise FakeNVMLError("Not Supported")
        return 250_000  # milliwatts

    return types.SimpleNamespace(
        NVMLError=FakeNVMLError,
        nvmlDeviceGetCount=lambda: len(handles),
        nvmlDeviceGetHandleByIndex=lambda index: handles[index],
        nvmlDeviceGetName=lambda handle: b"Fake GPU",
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=utilization[handle], memory=10),
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=3 * 2**30, total=16 * 2**30),
        nvmlDeviceGetPowerUsage=power,
        nvmlShutdown=lambda: None,
    )


def test_sampler_records_every_gpu_and_summarizes():
    sampler = monitor.Sampler(interval_s=0.01, nvml=fake_nvml())
    rows = [sampler.sample() for _ in range(5)]
    sampler.samples = rows
    summary = sampler.summary()
    assert summary["gpu_available"] and summary["gpu_unavailable_reason"] is None
    assert [g["name"] for g in summary["gpus"]] == ["Fake GPU", "Fake GPU"]
    assert summary["gpus"][0]["utilization_percent"] == {"mean": 40.0, "p50": 40.0, "p95": 40.0, "max": 40.0}
    assert summary["gpus"][1]["memory_used_mb"]["mean"] == 3 * 1024
    assert summary["gpus"][0]["power_w"]["p95"] == 250.0
    assert summary["gpu_utilization_percent"] == 65.0
    assert summary["cpu_utilization_percent"]["mean"] >= 0


def test_unsupported_power_reading_is_none_not_zero():
    sampler = monitor.Sampler(nvml=fake_nvml(power_fails=True))
    row = sampler.sample()
    assert row["gpus"][0]["power_w"] is None and row["gpus"][0]["utilization_percent"] == 40.0
    sampler.samples = [row]
    assert sampler.summary()["gpus"][0]["power_w"] is None


def test_background_thread_samples_until_stopped():
    import time

    sampler = monitor.Sampler(interval_s=0.02, nvml=fake_nvml())
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    count = len(sampler.samples)
    time.sleep(0.1)
    assert count >= 5 and len(sampler.samples) == count


def test_without_nvml_gpu_figures_are_unavailable_never_invented():
    sampler = monitor.Sampler(interval_s=0.01, nvml=None, nvml_reason="NVML is unavailable: no driver")
    sampler.samples = [sampler.sample() for _ in range(3)]
    summary = sampler.summary()
    assert not summary["gpu_available"] and summary["gpus"] == []
    assert summary["gpu_utilization_percent"] is None
    assert summary["gpu_unavailable_reason"] == "NVML is unavailable: no driver"


def test_real_nvml_is_the_default():
    """On this machine the default path loads the real pynvml; without a GPU it says why, once."""
    sampler = monitor.Sampler(interval_s=0.01)
    if sampler.gpu_available:
        import pynvml

        assert sampler.nvml is pynvml
    else:
        assert "NVML" in sampler.gpu_unavailable_reason or "nvidia-ml-py" in sampler.gpu_unavailable_reason


@pytest.mark.gpu
def test_real_gpu_is_sampled():
    sampler = monitor.Sampler(interval_s=0.05)
    assert sampler.gpu_available
    sampler.samples = [sampler.sample() for _ in range(3)]
    summary = sampler.summary()
    assert summary["gpu_utilization_percent"] is not None
    assert 0 <= summary["gpus"][0]["utilization_percent"]["max"] <= 100
