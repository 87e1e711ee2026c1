"""The utilization sampler: its real NVML path is the default; a fake NVML stands in only where no GPU exists.

The fake follows nvidia-ml-py's API: the same function names (checked against the real
module), the binding's own structs, constants and error classes, and GPM samples that are
opaque pointers filled by nvmlGpmSampleGet and compared by nvmlGpmMetricsGet.
"""

import ctypes
import itertools
import json
import subprocess
import sys
import time
import types
from pathlib import Path

import pynvml
import pytest

from train.benchmarks import report
from train.measure import monitor
from train.measure.sampler import SampleWriter

ROOT = Path(__file__).resolve().parents[1]

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
    addresses = itertools.count(0x1000, 0x10)
    taken: dict[int, tuple[int, int]] = {}  # sample address -> (handle, tick)
    ticks = itertools.count(1)
    state = types.SimpleNamespace(allocated=set(), freed=set(), metric_calls=0)

    def power(handle):
        if power_fails:
            raise pynvml.NVMLError_NotSupported()
        return 250_000  # milliwatts

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

    functions = dict(
        nvmlDeviceGetCount=lambda: len(handles),
        nvmlDeviceGetHandleByIndex=lambda index: handles[index],
        nvmlDeviceGetName=lambda handle: "NVIDIA H100 80GB HBM3" if gpm == "supported" else "Tesla T4",
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=utilization[handle], memory=10),
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=3 * 2**30, total=16 * 2**30),
        nvmlDeviceGetPowerUsage=power,
        nvmlGpmQueryDeviceSupport=query_support,
        nvmlGpmSampleAlloc=sample_alloc,
        nvmlGpmSampleFree=sample_free,
        nvmlGpmSampleGet=sample_get,
        nvmlGpmMetricsGet=metrics_get,
        nvmlShutdown=lambda: None,
    )
    binding = {name: getattr(pynvml, name) for name in dir(pynvml) if name.startswith(("NVML", "c_nvml"))}
    module = types.SimpleNamespace(**binding, **functions)
    module.state = state
    return module


def test_the_fake_follows_the_real_binding():
    fake = fake_nvml()
    for name in vars(fake):
        if name.startswith("nvml"):
            assert callable(getattr(pynvml, name, None)), f"{name} is not a function of nvidia-ml-py"
    assert fake.NVMLError is pynvml.NVMLError and fake.c_nvmlGpmMetricsGet_t is pynvml.c_nvmlGpmMetricsGet_t


def test_sampler_records_every_gpu_and_summarizes():
    sampler = monitor.Sampler(interval_s=0.01, nvml=fake_nvml())
    rows = [sampler.sample() for _ in range(5)]
    sampler.samples = rows
    summary = sampler.summary()
    assert summary["gpu_available"] and summary["gpu_unavailable_reason"] is None
    assert [g["name"] for g in summary["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
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


# --- SM activity, SM occupancy, tensor-core activity (NVML GPM) ------------------------------


def test_gpm_gpu_records_sm_and_tensor_activity_between_samples():
    nvml = fake_nvml()
    sampler = monitor.Sampler(interval_s=0.01, nvml=nvml)
    rows = [sampler.sample() for _ in range(4)]
    first = rows[0]["gpus"][0]
    assert first["sm_activity_percent"] is None and first["utilization_percent"] == 40.0  # no interval yet
    assert rows[1]["gpus"][0]["sm_activity_percent"] == 55.0
    assert rows[1]["gpus"][0]["sm_occupancy_percent"] == 31.5
    assert rows[1]["gpus"][0]["tensor_activity_percent"] == 20.0
    assert rows[3]["gpus"][1]["sm_activity_percent"] == 65.0
    sampler.samples = rows
    summary = sampler.summary()
    assert summary["gpm_unavailable_reason"] is None and sampler.gpm_unavailable_reason is None
    assert summary["gpus"][0]["sm_activity_percent"] == {"mean": 55.0, "p50": 55.0, "p95": 55.0, "max": 55.0}
    assert summary["gpus"][1]["tensor_activity_percent"]["mean"] == 30.0
    assert summary["sm_activity_percent"] == 60.0 and summary["sm_occupancy_percent"] == 36.5
    assert summary["tensor_activity_percent"] == 25.0 and summary["gpu_utilization_percent"] == 65.0
    assert nvml.state.metric_calls == 6  # 3 intervals x 2 GPUs
    sampler.stop()
    assert nvml.state.allocated == nvml.state.freed and len(nvml.state.allocated) == 4


def test_gpm_in_the_background_thread_has_figures_from_the_first_row():
    nvml = fake_nvml(utilization=(70,))
    sampler = monitor.Sampler(interval_s=0.02, nvml=nvml)
    sampler.start()
    deadline = time.monotonic() + 10
    while len(sampler.samples) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert all(row["gpus"][0]["sm_activity_percent"] == 55.0 for row in sampler.samples)
    assert nvml.state.allocated == nvml.state.freed


def test_a_metric_the_gpu_does_not_report_is_none_and_the_others_are_kept():
    values = {k: v for k, v in GPM_VALUES.items() if k != pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL}
    sampler = monitor.Sampler(nvml=fake_nvml(utilization=(40,), gpm_values=values))
    sampler.samples = [sampler.sample() for _ in range(3)]
    summary = sampler.summary()
    assert summary["sm_activity_percent"] == 55.0 and summary["tensor_activity_percent"] is None


@pytest.mark.parametrize(
    "gpm, reason",
    [
        ("unsupported", "NVML GPM metrics are not supported on this GPU (Hopper or newer needed)"),
        ("no-permission", "no permission to read NVML GPM metrics"),
        ("old-driver", "the driver's NVML has no GPM functions (driver too old)"),
    ],
)
def test_gpu_without_gpm_reads_none_with_the_reason_never_zero(gpm, reason):
    sampler = monitor.Sampler(interval_s=0.01, nvml=fake_nvml(gpm=gpm))
    sampler.samples = [sampler.sample() for _ in range(3)]
    assert all(gpu[key] is None for row in sampler.samples for gpu in row["gpus"] for key in monitor.GPM_KEYS)
    summary = sampler.summary()
    assert summary["gpu_utilization_percent"] == 65.0  # NVML utilization is still there
    assert summary["sm_activity_percent"] is None and summary["tensor_activity_percent"] is None
    assert summary["sm_occupancy_percent"] is None
    assert summary["gpm_unavailable_reason"] == f"GPU 0, 1 (Tesla T4): {reason}"
    assert summary["gpus"][1]["gpm_unavailable_reason"] == reason and summary["gpus"][1]["sm_activity_percent"] is None


def test_a_binding_without_gpm_functions_says_so():
    nvml = fake_nvml(utilization=(40,))
    del nvml.nvmlGpmQueryDeviceSupport
    sampler = monitor.Sampler(nvml=nvml)
    sampler.samples = [sampler.sample() for _ in range(2)]
    assert sampler.summary()["sm_activity_percent"] is None
    assert "no GPM functions" in sampler.gpm_unavailable_reason


@pytest.mark.parametrize("kind", ["no-driver", "no-gpu"])
def test_without_a_gpu_sm_activity_is_none_with_the_gpu_reason(kind):
    if kind == "no-driver":
        sampler = monitor.Sampler(interval_s=0.01, nvml=None, nvml_reason="NVML is unavailable: Driver Not Loaded")
    else:
        sampler = monitor.Sampler(interval_s=0.01, nvml=fake_nvml(utilization=()))
    sampler.samples = [sampler.sample() for _ in range(2)]
    summary = sampler.summary()
    assert summary["sm_activity_percent"] is None and summary["tensor_activity_percent"] is None
    assert summary["gpm_unavailable_reason"] == summary["gpu_unavailable_reason"]
    assert summary["gpm_unavailable_reason"] in ("NVML is unavailable: Driver Not Loaded", "NVML found no GPU")


def test_real_nvml_without_a_gpu_gives_the_reason_for_sm_activity_too():
    sampler = monitor.Sampler(interval_s=0.01)
    if sampler.gpu_available:
        pytest.skip("a GPU is present: test_real_gpu_is_sampled covers it")
    sampler.samples = [sampler.sample()]
    summary = sampler.summary()
    assert summary["sm_activity_percent"] is None and summary["gpm_unavailable_reason"]


# --- the compare report ---------------------------------------------------------------------


def run_summary(name: str, sampler: monitor.Sampler, rate: float, device: str) -> dict:
    """What summary.json holds for the report, with the sampler's real summary as `utilization`."""
    sampler.samples = [sampler.sample() for _ in range(4)]
    usage = sampler.summary()
    return {
        "name": name,
        "device": device,
        "device_kind": "gpu" if sampler.gpu_available else "cpu",
        "model": "tiny",
        "pipeline": f"{name} pipeline",
        "batch_size": 16,
        "choices": {"precision": "mixed_float16", "jit_compile": True, "steps_per_execution": 1},
        "examples_per_sec": rate,
        "step_time_ms": 1000 * 16 / rate,
        "input_bound_percent": 80.0 if name == "naive" else 2.0,
        "device_busy_percent": None,
        "val_accuracy": 0.5,
        "profile": None,
        "utilization": usage,
        "cpu_utilization_percent": usage["cpu_utilization_percent"]["mean"],
        "gpu_utilization_percent": usage["gpu_utilization_percent"],
    }


def drawn_chart(monkeypatch, out_dir, result) -> dict:
    """report.write, keeping what its chart drew: utilization panel tick labels, bar labels, notes."""
    import matplotlib.pyplot as plt

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figures.append(fig), close(fig)))
    report.write(out_dir, result)
    panel = figures[0].axes[2]
    return {
        "ticks": [label.get_text() for label in panel.get_xticklabels()],
        "bar_labels": [text.get_text() for text in panel.texts],
        "notes": [text.get_text() for text in figures[0].texts if "n/a" in text.get_text()],
    }


def test_compare_report_shows_sm_activity_next_to_nvml_utilization(tmp_path, monkeypatch):
    runs = {
        name: run_summary(name, monitor.Sampler(nvml=fake_nvml(utilization=(util,))), rate, "1x NVIDIA H100")
        for name, util, rate in (("naive", 97, 1000.0), ("optimized", 99, 5000.0))
    }
    result = report.build(runs, scenario=None)
    drawn = drawn_chart(monkeypatch, tmp_path, result)

    saved = json.loads((tmp_path / "report.json").read_text())
    row = saved["runs"]["optimized"]
    assert row["gpu_utilization_percent"] == 99.0 and row["sm_activity_percent"] == 55.0
    assert row["sm_occupancy_percent"] == 31.5 and row["tensor_activity_percent"] == 20.0
    assert row["gpm_unavailable_reason"] is None

    lines = (tmp_path / "report.md").read_text().splitlines()
    labels = [line.split("|")[1].strip() for line in lines if line.startswith("| ")]
    at = labels.index("GPU utilization (NVML)")
    assert labels[at + 1 : at + 4] == [
        "SM activity (NVML GPM)",
        "SM occupancy (NVML GPM)",
        "tensor-core activity (NVML GPM)",
    ]
    assert "| SM activity (NVML GPM) | 55.0 % | 55.0 % |" in lines
    assert "| tensor-core activity (NVML GPM) | 20.0 % | 20.0 % |" in lines
    assert not any("n/a" in line for line in lines if "GPM" in line or "GPU" in line)

    at = drawn["ticks"].index("GPU util (NVML)")
    assert drawn["ticks"][at + 1 : at + 3] == ["SM activity (GPM)", "tensor cores (GPM)"]
    assert {"55", "20", "99"} <= set(drawn["bar_labels"]) and not drawn["notes"]
    assert (tmp_path / "report.png").stat().st_size > 10_000
    assert "SM activity (NVML GPM)" in report.table(result)


def test_compare_report_on_this_cpu_reads_n_a_with_the_reason_never_zero(tmp_path, monkeypatch):
    runs = {
        name: run_summary(name, monitor.Sampler(), rate, "CPU only")
        for name, rate in (("naive", 100.0), ("optimized", 400.0))
    }
    reason = runs["naive"]["utilization"]["gpm_unavailable_reason"]
    if runs["naive"]["utilization"]["gpu_available"]:
        pytest.skip("this machine has a GPU")
    result = report.build(runs, scenario=None)
    drawn = drawn_chart(monkeypatch, tmp_path, result)

    saved = json.loads((tmp_path / "report.json").read_text())
    for row in saved["runs"].values():
        assert row["sm_activity_percent"] is None and row["tensor_activity_percent"] is None
        assert row["gpm_unavailable_reason"] == reason and reason
    text = (tmp_path / "report.md").read_text()
    assert "| SM activity (NVML GPM) | n/a | n/a |" in text
    assert "| tensor-core activity (NVML GPM) | n/a | n/a |" in text
    assert f"SM occupancy, tensor-core activity) are n/a: {reason}." in text
    # device busy (no profile here), GPU util, SM activity, tensor cores: n/a for both runs
    assert drawn["bar_labels"].count("n/a") == 4 * 2
    assert any(reason in note for note in drawn["notes"])


def test_report_of_an_older_summary_without_gpm_figures_says_so():
    summary = run_summary("naive", monitor.Sampler(nvml=fake_nvml(utilization=(50,))), 100.0, "1x GPU")
    for key in ("gpm_unavailable_reason", *monitor.GPM_KEYS):
        del summary["utilization"][key]
    row = report.run_row(summary)
    assert row["sm_activity_percent"] is None and row["gpm_unavailable_reason"] == "not recorded by this run"
    assert report.run_row({**summary, "utilization": None})["gpm_unavailable_reason"] == report.NOT_SAMPLED


@pytest.mark.gpu
def test_real_gpu_is_sampled():
    sampler = monitor.Sampler(interval_s=0.05)
    assert sampler.gpu_available
    sampler.samples = [sampler.sample() for _ in range(3)]
    summary = sampler.summary()
    assert summary["gpu_utilization_percent"] is not None
    assert 0 <= summary["gpus"][0]["utilization_percent"]["max"] <= 100
    # SM activity: a number on GPUs with GPM (Hopper and newer), else None with the reason, never 0 invented.
    for gpu in summary["gpus"]:
        if gpu["gpm_unavailable_reason"] is None:
            assert 0 <= gpu["sm_activity_percent"]["max"] <= 100
        else:
            assert gpu["sm_activity_percent"] is None
    sampler.stop()


# --- the sampler without Keras or TensorFlow (python -m train profile samples from outside the run) ----------


def test_the_sampler_and_its_writer_import_neither_keras_nor_tensorflow(tmp_path):
    code = (
        "import sys\n"
        "from train.measure import sampler\n"
        "s = sampler.Sampler(interval_s=0.01)\n"
        "s.samples = [s.sample() for _ in range(3)]\n"
        f"w = sampler.SampleWriter({str(tmp_path)!r})\n"
        "w.write(s.samples)\n"
        "w.close()\n"
        "print(sorted({'keras', 'tensorflow'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert list(tmp_path.glob("events.out.tfevents.*"))


def test_sample_writer_appends_rows_that_tensorboard_reads_with_their_times(tmp_path):
    import tensorflow as tf

    sampler = monitor.Sampler(interval_s=0.01, nvml=fake_nvml())
    sampler.samples = [sampler.sample() for _ in range(3)]
    writer = SampleWriter(tmp_path)
    writer.write(sampler.samples)
    sampler.samples.append(sampler.sample())
    writer.write(sampler.samples)  # only the new row
    writer.close()
    events = [e for e in tf.compat.v1.train.summary_iterator(str(writer.path)) if e.summary.value]
    assert [e.step for e in events] == [0, 1, 2, 3]
    assert [e.wall_time for e in events] == pytest.approx([row["time"] for row in sampler.samples])
    values = {v.tag: v.simple_value for v in events[1].summary.value}
    assert values["gpu0/utilization_percent"] == 40.0 and values["gpu1/utilization_percent"] == 90.0
    assert values["gpu0/sm_activity_percent"] == 55.0 and "cpu_utilization_percent" in values
    assert "gpu0/sm_activity_percent" not in {v.tag for v in events[0].summary.value}  # None: not written
