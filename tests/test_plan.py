"""Every `auto` decided in one place (train/training/plan.py), for devices and data this machine may not
have: the choices are pure logic of the detected devices and the dataset."""

import dataclasses

import pytest

from tests.conftest import ROOT
from train import config
from train.config import TrainConfig
from train.training import devices, plan
from train.workloads.image import pipeline
from train.workloads.image.choices import pipeline_choices

CPU = devices.Devices(gpus=(), compute_capabilities=(), cpu_cores=2, cpu_bf16=False)
CPU_BF16 = devices.Devices(gpus=(), compute_capabilities=(), cpu_cores=2, cpu_bf16=True)
A100 = devices.Devices(gpus=("NVIDIA A100",), compute_capabilities=((8, 0),), cpu_cores=16)
TWO_H100 = devices.Devices(gpus=("NVIDIA H100",) * 2, compute_capabilities=((9, 0),) * 2, cpu_cores=32)
P100 = devices.Devices(gpus=("Tesla P100",), compute_capabilities=((6, 0),), cpu_cores=8)


def knobs(preset: str, **changes):
    return dataclasses.replace(config.load(ROOT / f"configs/{preset}.yaml").pipeline, **changes)


def decided(spec, knob, num_examples=None, gpu=False):
    return pipeline_choices(knob, spec, gpu=gpu, num_examples=num_examples)[0]


def test_auto_on_a_cpu_without_bf16_units():
    choice = plan.train_choices(TrainConfig(), CPU)
    assert (choice.precision, choice.jit_compile, choice.steps_per_execution, choice.strategy) == (
        "float32",
        False,
        1,
        "default",
    )
    assert "CPU" in choice.reasons["precision"] and "slower" in choice.reasons["jit_compile"]


def test_auto_on_a_cpu_with_bf16_units():
    assert plan.train_choices(TrainConfig(), CPU_BF16).precision == "mixed_bfloat16"


def test_auto_on_tensor_core_gpus():
    choice = plan.train_choices(TrainConfig(), A100)
    assert (choice.precision, choice.jit_compile, choice.strategy) == ("mixed_float16", True, "default")
    assert plan.train_choices(TrainConfig(), TWO_H100).strategy == "mirrored"


def test_auto_on_an_old_gpu_keeps_float32():
    assert plan.train_choices(TrainConfig(), P100).precision == "float32"


def test_mixed_means_the_devices_own_mixed_policy():
    assert plan.train_choices(TrainConfig(precision="mixed"), CPU).precision == "mixed_bfloat16"
    assert plan.train_choices(TrainConfig(precision="mixed"), A100).precision == "mixed_float16"


def test_explicit_values_are_kept():
    choice = plan.train_choices(
        TrainConfig(precision="float32", jit_compile=True, steps_per_execution=8, strategy="default"), A100
    )
    assert (choice.precision, choice.jit_compile, choice.steps_per_execution, choice.strategy) == (
        "float32",
        True,
        8,
        "default",
    )
    assert choice.reasons == {}


def test_xla_is_recorded_off_where_keras_or_a_cpu_mirror_would_not_use_it():
    deterministic = plan.train_choices(TrainConfig(jit_compile=True, deterministic=True), A100)
    assert deterministic.jit_compile is False and "train.deterministic" in deterministic.reasons["jit_compile"]
    mirrored = plan.train_choices(TrainConfig(jit_compile=True, strategy="mirrored", cpu_replicas=2), CPU)
    assert mirrored.jit_compile is False and "logical CPUs" in mirrored.reasons["jit_compile"]


def test_tf_config_selects_multi_worker(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 0}}')
    assert plan.train_choices(TrainConfig(), CPU).strategy == "multi_worker"


def test_one_resolver_decides_train_and_pipeline_and_says_why(tiny_spec):
    cfg = config.load(ROOT / "configs/optimized.yaml", ["pipeline.augment=auto", "train.deterministic=true"])
    on_gpu, choices = plan.resolve(cfg, A100, tiny_spec)
    assert (on_gpu.train.precision, on_gpu.pipeline.augment, on_gpu.pipeline.cache) == (
        "mixed_float16",
        "device",
        "memory",
    )
    assert on_gpu.pipeline.deterministic is True  # train.deterministic orders the pipeline too
    assert on_gpu.train.stall_timeout_s == 0.0 and "off" in choices.reasons["stall_timeout_s"]
    for knob in ("precision", "jit_compile", "strategy", "pipeline.augment", "pipeline.cache"):
        assert choices.reasons[knob], knob
    on_cpu, _ = plan.resolve(cfg, CPU, tiny_spec)
    assert (on_cpu.train.precision, on_cpu.pipeline.augment) == ("float32", "batched")
    served = cfg.with_section("pipeline", dataclasses.replace(cfg.pipeline, data_service="grpc://host:5050"))
    assert plan.resolve(served, CPU, tiny_spec)[0].train.stall_timeout_s == 300.0


def test_the_pipeline_refuses_knobs_nobody_decided(tiny_spec):
    undecided = knobs("optimized", augment="auto")
    for call in (
        lambda: pipeline.build(tiny_spec.train_files, tiny_spec, undecided, training=True, batch_size=8),
        lambda: pipeline.describe(undecided, tiny_spec, tiny_spec.num_train, 8),
    ):
        with pytest.raises(
            ValueError,
            match=r"pipeline.cache, pipeline.augment, pipeline.shuffle_before_decode are still 'auto'.*plan.resolve",
        ):
            call()


def test_warmup_auto_is_the_first_of_the_epochs_this_process_trains():
    assert plan.warmup_steps("auto", 8, epochs=3) == 8
    assert plan.warmup_steps("auto", 8, epochs=1) == 2  # one epoch: a quarter of it
    assert plan.warmup_steps(5, 8, epochs=3) == 5


def test_detect_reads_this_machine():
    found = devices.detect()
    assert found.cpu_cores >= 1
    assert found.describe().startswith("CPU only") == (not found.gpus)


@pytest.mark.gpu
def test_detect_finds_the_gpu():
    assert devices.detect().gpus


# --- what to cache, where to shuffle and augment ----------------------------------------------


MANY = 100_000  # examples: sizes in whole megabytes, as the limit is


def cache_choice(tiny_spec, preset="optimized", **overrides) -> str:
    return decided(tiny_spec, knobs(preset, **overrides), MANY).cache


def test_cache_auto_prefers_decoded_then_disk_then_encoded_then_none(tiny_spec, tmp_path):
    decoded = pipeline.decoded_size_mb(tiny_spec, knobs("optimized"), MANY, copies=2)
    encoded = pipeline.encoded_size_mb(tiny_spec, MANY)
    assert encoded < decoded  # JPEG bytes are smaller than pixels at the stored size
    assert cache_choice(tiny_spec, cache_limit_mb=int(decoded) + 1) == "memory"
    between = int(encoded) + 1  # the records fit, the decoded images (with their mirrors) do not
    assert between < decoded
    assert cache_choice(tiny_spec, cache_limit_mb=between) == "encoded"
    assert cache_choice(tiny_spec, cache_limit_mb=between, cache_dir=str(tmp_path)) == "disk"
    assert cache_choice(tiny_spec, cache_limit_mb=0) == "none"
    # A decoded cache would freeze the random crops.
    assert cache_choice(tiny_spec, random_crop=True, cache_limit_mb=between) == "encoded"
    assert cache_choice(tiny_spec, "naive") == "none"


def test_records_are_shuffled_before_decode_only_when_nothing_decoded_is_cached(tiny_spec):
    def resolved(**overrides):
        return decided(tiny_spec, knobs("optimized", **overrides))

    assert resolved().shuffle_before_decode is False
    assert resolved(cache_limit_mb=0).shuffle_before_decode is True
    assert "shuffle(10000) of records -> map(decode" in pipeline.describe(
        resolved(cache_limit_mb=0), tiny_spec, tiny_spec.num_train, 8
    )
    naive = decided(tiny_spec, knobs("naive"))
    assert naive.shuffle_before_decode is False  # the Python generator shuffles decoded examples


def test_augment_auto_runs_on_the_device_where_a_gpu_exists(tiny_spec):
    assert decided(tiny_spec, knobs("optimized", augment="auto"), gpu=True).augment == "device"
    assert decided(tiny_spec, knobs("optimized", augment="auto"), gpu=False).augment == "batched"


def test_a_cache_never_keeps_what_the_generator_augmented(tiny_spec):
    """The naive generator augments: a decoded cache after it would show every epoch the first epoch's flips."""
    assert cache_choice(tiny_spec, "naive", cache="auto") == "none"
    assert cache_choice(tiny_spec, "naive", cache="auto", augment="none") == "memory"
    with pytest.raises(config.UserError, match=r"'pipeline.cache' is 'memory' but must be 'auto' or 'none'"):
        config.load(ROOT / "configs/naive.yaml", ["pipeline.cache=memory"])
