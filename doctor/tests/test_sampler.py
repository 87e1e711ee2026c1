"""The utilization sampler: its real NVML path is the default; a fake NVML stands in only where no GPU exists
(step_doctor_dev/fake_nvml.py, which follows nvidia-ml-py's API)."""

import subprocess
import sys
import time

import pynvml
import pytest

from step_doctor.sampler import GPM_KEYS, Sampler, SampleWriter
from step_doctor_dev.fake_nvml import GPM_VALUES, fake_nvml
from tests.conftest import DOCTOR


def test_the_fake_follows_the_real_binding():
    fake = fake_nvml()
    for name in vars(fake):
        if name.startswith("nvml"):
            assert callable(getattr(pynvml, name, None)), f"{name} is not a function of nvidia-ml-py"
    assert fake.NVMLError is pynvml.NVMLError and fake.c_nvmlGpmMetricsGet_t is pynvml.c_nvmlGpmMetricsGet_t


def test_sampler_records_every_gpu_and_summarizes():
    sampler = Sampler(interval_s=0.01, nvml=fake_nvml())
    rows = [sampler.sample() for _ in range(5)]
    sampler.samples = rows
    summary = sampler.summary()
    assert summary["gpu_available"] and summary["gpu_unavailable_reason"] is None
    assert [g["name"] for g in summary["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
    assert summary["gpus"][0]["utilization_percent"] == {"mean": 40.0, "p50": 40.0, "p95": 40.0, "max": 40.0}
    assert summary["gpus"][1]["memory_used_mb"]["mean"] == 3 * 1024
    assert summary["gpus"][0]["power_w"]["p95"] == 250.0
    assert summary["gpu_utilization_percent"] == 65.0
    cpu = [row["cpu_percent"] for row in rows]  # psutil's, over each interval: the summary is of these
    assert all(0 <= value <= 100 for value in cpu)
    assert summary["cpu_utilization_percent"]["mean"] == pytest.approx(sum(cpu) / len(cpu), abs=0.1)
    assert summary["cpu_utilization_percent"]["max"] == pytest.approx(max(cpu), abs=0.1)


def test_unsupported_power_reading_is_none_not_zero():
    sampler = Sampler(nvml=fake_nvml(power_fails=True))
    row = sampler.sample()
    assert row["gpus"][0]["power_w"] is None and row["gpus"][0]["utilization_percent"] == 40.0
    sampler.samples = [row]
    assert sampler.summary()["gpus"][0]["power_w"] is None


def test_background_thread_samples_until_stopped():
    sampler = Sampler(interval_s=0.02, nvml=fake_nvml())
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    count = len(sampler.samples)
    time.sleep(0.1)
    assert count >= 5 and len(sampler.samples) == count


def test_without_nvml_gpu_figures_are_unavailable_never_invented():
    sampler = Sampler(interval_s=0.01, nvml=None, nvml_reason="NVML is unavailable: no driver")
    sampler.samples = [sampler.sample() for _ in range(3)]
    summary = sampler.summary()
    assert not summary["gpu_available"] and summary["gpus"] == []
    assert summary["gpu_utilization_percent"] is None
    assert summary["gpu_unavailable_reason"] == "NVML is unavailable: no driver"


def test_real_nvml_is_the_default():
    """On this machine the default path loads the real pynvml; without a GPU it says why, once."""
    sampler = Sampler(interval_s=0.01)
    if sampler.gpu_available:
        import pynvml

        assert sampler.nvml is pynvml
    else:
        assert "NVML" in sampler.gpu_unavailable_reason or "nvidia-ml-py" in sampler.gpu_unavailable_reason


# --- SM activity, SM occupancy, tensor-core activity (NVML GPM) ------------------------------


def test_gpm_gpu_records_sm_and_tensor_activity_between_samples():
    nvml = fake_nvml()
    sampler = Sampler(interval_s=0.01, nvml=nvml)
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
    sampler = Sampler(interval_s=0.02, nvml=nvml)
    sampler.start()
    deadline = time.monotonic() + 10
    while len(sampler.samples) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert all(row["gpus"][0]["sm_activity_percent"] == 55.0 for row in sampler.samples)
    assert nvml.state.allocated == nvml.state.freed


def test_a_metric_the_gpu_does_not_report_is_none_and_the_others_are_kept():
    values = {k: v for k, v in GPM_VALUES.items() if k != pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL}
    sampler = Sampler(nvml=fake_nvml(utilization=(40,), gpm_values=values))
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
    sampler = Sampler(interval_s=0.01, nvml=fake_nvml(gpm=gpm))
    sampler.samples = [sampler.sample() for _ in range(3)]
    assert all(gpu[key] is None for row in sampler.samples for gpu in row["gpus"] for key in GPM_KEYS)
    summary = sampler.summary()
    assert summary["gpu_utilization_percent"] == 65.0  # NVML utilization is still there
    assert summary["sm_activity_percent"] is None and summary["tensor_activity_percent"] is None
    assert summary["sm_occupancy_percent"] is None
    assert summary["gpm_unavailable_reason"] == f"GPU 0, 1 (Tesla T4): {reason}"
    assert summary["gpus"][1]["gpm_unavailable_reason"] == reason and summary["gpus"][1]["sm_activity_percent"] is None


def test_a_binding_without_gpm_functions_says_so():
    nvml = fake_nvml(utilization=(40,))
    del nvml.nvmlGpmQueryDeviceSupport
    sampler = Sampler(nvml=nvml)
    sampler.samples = [sampler.sample() for _ in range(2)]
    assert sampler.summary()["sm_activity_percent"] is None
    assert "no GPM functions" in sampler.gpm_unavailable_reason


@pytest.mark.parametrize("kind", ["no-driver", "no-gpu"])
def test_without_a_gpu_sm_activity_is_none_with_the_gpu_reason(kind):
    if kind == "no-driver":
        sampler = Sampler(interval_s=0.01, nvml=None, nvml_reason="NVML is unavailable: Driver Not Loaded")
    else:
        sampler = Sampler(interval_s=0.01, nvml=fake_nvml(utilization=()))
    sampler.samples = [sampler.sample() for _ in range(2)]
    summary = sampler.summary()
    assert summary["sm_activity_percent"] is None and summary["tensor_activity_percent"] is None
    assert summary["gpm_unavailable_reason"] == summary["gpu_unavailable_reason"]
    assert summary["gpm_unavailable_reason"] in ("NVML is unavailable: Driver Not Loaded", "NVML found no GPU")


def test_real_nvml_without_a_gpu_gives_the_reason_for_sm_activity_too():
    sampler = Sampler(interval_s=0.01)
    if sampler.gpu_available:
        pytest.skip("a GPU is present: test_real_gpu_is_sampled covers it")
    sampler.samples = [sampler.sample()]
    summary = sampler.summary()
    assert summary["sm_activity_percent"] is None and summary["gpm_unavailable_reason"]


@pytest.mark.gpu
def test_real_gpu_is_sampled():
    sampler = Sampler(interval_s=0.05)
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


# --- the sampler without Keras or TensorFlow (step-doctor profile samples from outside the run) ----------


def test_the_sampler_and_its_writer_import_neither_keras_nor_tensorflow(tmp_path):
    code = (
        "import sys\n"
        "from step_doctor import sampler\n"
        "s = sampler.Sampler(interval_s=0.01)\n"
        "s.samples = [s.sample() for _ in range(3)]\n"
        f"w = sampler.SampleWriter({str(tmp_path)!r})\n"
        "w.write(s.samples)\n"
        "w.close()\n"
        "print(sorted({'keras', 'tensorflow'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=DOCTOR, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert list(tmp_path.glob("events.out.tfevents.*"))


def test_sample_writer_appends_rows_that_tensorboard_reads_with_their_times(tmp_path):
    import tensorflow as tf

    sampler = Sampler(interval_s=0.01, nvml=fake_nvml())
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
