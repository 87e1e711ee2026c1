"""The sampler against a real GPU under load (marked gpu: skipped where NVML finds none).

A GPU kept busy with bfloat16 matrix products reads as busy (NVML utilization, GPM SM and
tensor-core activity), and the same GPU idle reads lower, in one process, sampled by the same
Sampler that `step-doctor profile` and the template's monitor use. The load comes from PyTorch
where it is installed (the project's GPU test machine has it; the doctor does not depend on it),
and the test skips without it: TensorFlow on a GPU is the template's job, not this test's.
"""

from __future__ import annotations

import threading
import time

import pytest

from step_doctor.sampler import Sampler

pytestmark = pytest.mark.gpu


def _sampled(seconds: float, work=None) -> dict:
    sampler = Sampler(interval_s=0.1)
    if not sampler.gpu_available:
        pytest.skip("needs an NVIDIA GPU with a working driver")
    done = threading.Event()
    worker = threading.Thread(target=work, args=(done,), daemon=True) if work else None
    if worker:
        worker.start()
        time.sleep(1.0)  # the load running before sampling starts
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    done.set()
    if worker:
        worker.join(timeout=30)
    return sampler.summary()


def test_a_busy_gpu_reads_busy_and_an_idle_one_does_not():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no GPU")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def load(done: threading.Event) -> None:
        while not done.is_set():
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()

    idle, busy = _sampled(3.0), _sampled(5.0, load)
    print({"idle": idle["gpus"][0], "busy": busy["gpus"][0]})
    assert busy["gpu_utilization_percent"] >= 90 and idle["gpu_utilization_percent"] <= 10, (idle, busy)
    gpu = busy["gpus"][0]
    if gpu["gpm_unavailable_reason"] is None:  # Hopper and newer: GPM
        assert gpu["sm_activity_percent"]["mean"] >= 50 and gpu["tensor_activity_percent"]["mean"] > 10, gpu
        assert idle["gpus"][0]["sm_activity_percent"]["mean"] <= 10, idle["gpus"][0]
    else:
        assert gpu["sm_activity_percent"] is None and gpu["gpm_unavailable_reason"]
