"""Every `auto` choice, for devices this machine may not have (the choice is pure logic)."""

import pytest

from train.config import TrainConfig
from train.training import devices

CPU = devices.Devices(gpus=(), compute_capabilities=(), cpu_cores=2, cpu_bf16=False)
CPU_BF16 = devices.Devices(gpus=(), compute_capabilities=(), cpu_cores=2, cpu_bf16=True)
A100 = devices.Devices(gpus=("NVIDIA A100",), compute_capabilities=((8, 0),), cpu_cores=16)
TWO_H100 = devices.Devices(gpus=("NVIDIA H100",) * 2, compute_capabilities=((9, 0),) * 2, cpu_cores=32)
P100 = devices.Devices(gpus=("Tesla P100",), compute_capabilities=((6, 0),), cpu_cores=8)


def test_auto_on_a_cpu_without_bf16_units():
    choice = devices.resolve(TrainConfig(), CPU)
    assert (choice.precision, choice.jit_compile, choice.steps_per_execution, choice.strategy) == (
        "float32",
        False,
        1,
        "default",
    )
    assert "CPU" in choice.reasons["precision"] and "slower" in choice.reasons["jit_compile"]


def test_auto_on_a_cpu_with_bf16_units():
    assert devices.resolve(TrainConfig(), CPU_BF16).precision == "mixed_bfloat16"


def test_auto_on_tensor_core_gpus():
    choice = devices.resolve(TrainConfig(), A100)
    assert (choice.precision, choice.jit_compile, choice.strategy) == ("mixed_float16", True, "default")
    assert devices.resolve(TrainConfig(), TWO_H100).strategy == "mirrored"


def test_auto_on_an_old_gpu_keeps_float32():
    assert devices.resolve(TrainConfig(), P100).precision == "float32"


def test_mixed_means_the_devices_own_mixed_policy():
    assert devices.resolve(TrainConfig(precision="mixed"), CPU).precision == "mixed_bfloat16"
    assert devices.resolve(TrainConfig(precision="mixed"), A100).precision == "mixed_float16"


def test_explicit_values_are_kept():
    choice = devices.resolve(
        TrainConfig(precision="float32", jit_compile=True, steps_per_execution=8, strategy="default"), A100
    )
    assert (choice.precision, choice.jit_compile, choice.steps_per_execution, choice.strategy) == (
        "float32",
        True,
        8,
        "default",
    )
    assert choice.reasons == {}


def test_tf_config_selects_multi_worker(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 0}}')
    assert devices.resolve(TrainConfig(), CPU).strategy == "multi_worker"


def test_detect_reads_this_machine():
    found = devices.detect()
    assert found.cpu_cores >= 1
    assert found.describe().startswith("CPU only") == (not found.gpus)


@pytest.mark.gpu
def test_detect_finds_the_gpu():
    assert devices.detect().gpus
