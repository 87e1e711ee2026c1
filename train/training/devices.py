"""Device detection and every `auto` choice, made in one place from the detected devices.

What speeds up a modern NVIDIA GPU (float16 tensor cores, XLA fusion, many steps per
host round trip) can slow a CPU down: on the project's 2-core CPUs XLA made a small CNN
2-4x slower and mixed_bfloat16 about 7x slower. So `auto` means "what is fastest on
this device", and the choice and its reason are written into the run.
"""

from __future__ import annotations

import dataclasses
import os
import platform

import tensorflow as tf

from train.config import TrainConfig
from train.core.errors import UserError


@dataclasses.dataclass(frozen=True)
class Devices:
    gpus: tuple[str, ...]  # names, e.g. "NVIDIA H100 80GB HBM3"
    compute_capabilities: tuple[tuple[int, int], ...]
    cpu_cores: int
    cpu_bf16: bool = False  # the CPU has bfloat16 units (AVX512_BF16 or AMX)

    @property
    def kind(self) -> str:
        return "gpu" if self.gpus else "cpu"

    def describe(self) -> str:
        if self.gpus:
            names = sorted(set(self.gpus))
            return f"{len(self.gpus)}x GPU ({', '.join(names)})"
        bf16 = ", AVX512_BF16" if self.cpu_bf16 else ", no bf16 units"
        return f"CPU only ({self.cpu_cores} cores, {cpu_model()}{bf16})"


def detect() -> Devices:
    gpus, capabilities = [], []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        gpus.append(details.get("device_name", gpu.name))
        capabilities.append(tuple(details.get("compute_capability", (0, 0))))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return Devices(
        gpus=tuple(gpus),
        compute_capabilities=tuple(capabilities),
        cpu_cores=cores,
        cpu_bf16=bool(cpu_flags() & BF16_FLAGS),
    )


BF16_FLAGS = {"avx512_bf16", "amx_bf16"}


def split_cpu(replicas: int) -> None:
    """Split the CPU into `replicas` logical devices, to mirror over them where there is no GPU.

    TensorFlow fixes its devices when it first uses them: a process that mirrors over logical
    CPUs calls this before anything else runs (the benchmarks do, for every variant at once).
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu) or [None]
    if len(current) >= replicas:
        return
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    except RuntimeError:
        raise UserError(
            f"train.cpu_replicas={replicas}: TensorFlow in this process already runs on {len(current)} CPU "
            "device(s) and cannot split the CPU any more. Set train.cpu_replicas in the run's own config "
            "(each run of `make compare` gets its own process), or mirror over GPUs."
        ) from None


def cpu_model() -> str:
    """The processor's name (Linux /proc/cpuinfo), else what the platform module knows."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo); empty where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@dataclasses.dataclass(frozen=True)
class Choices:
    precision: str
    jit_compile: bool
    steps_per_execution: int
    strategy: str
    reasons: dict


def resolve(train: TrainConfig, devices: Devices) -> Choices:
    """Replace every `auto` in `train` with the choice for `devices`, and say why."""
    reasons = {}
    tensor_cores = bool(devices.gpus) and min(devices.compute_capabilities) >= (7, 0)

    precision = train.precision
    if precision == "auto":
        if tensor_cores:
            precision = "mixed_float16"
            reasons["precision"] = "GPU with tensor cores (compute capability >= 7.0): float16 math, float32 weights"
        elif devices.gpus:
            precision = "float32"
            reasons["precision"] = "GPU without tensor cores: float16 would not be faster"
        elif devices.cpu_bf16:
            precision = "mixed_bfloat16"
            reasons["precision"] = (
                "CPU with bfloat16 units (avx512_bf16/amx_bf16): bfloat16 math, float32 "
                "weights (the ladder's mixed-precision rung measures the gain)"
            )
        else:
            precision = "float32"
            reasons["precision"] = "CPU without bfloat16 units: float32 (mixed_bfloat16 was ~7x slower on such CPUs)"

    elif precision == "mixed":
        precision = "mixed_float16" if devices.gpus else "mixed_bfloat16"
        reasons["precision"] = (
            "mixed: float16 on GPU" if devices.gpus else "mixed: bfloat16 on CPU (asked for, though slower here)"
        )

    jit_compile = train.jit_compile
    if jit_compile == "auto":
        jit_compile = bool(devices.gpus)
        reasons["jit_compile"] = (
            "GPU: XLA fuses small kernels and cuts launch overhead"
            if devices.gpus
            else "CPU: XLA measured 2-4x slower for a small CNN on these CPUs (make ladder)"
        )

    if jit_compile and train.deterministic:
        # Keras compiles without XLA under op determinism (not every XLA op is deterministic) and
        # says nothing: the run records what really runs.
        jit_compile = False
        reasons["jit_compile"] = "off: train.deterministic (Keras does not compile with XLA under op determinism)"

    steps = train.steps_per_execution
    if steps == "auto":
        steps = 1
        reasons["steps_per_execution"] = (
            "1: xprof finds no step markers inside a multi-step execution, so larger values leave xprof's "
            "step-time analysis empty (diagnose infers steps per execution); raise it for small models where host "
            "overhead dominates (the ladder measures it)"
        )

    strategy = train.strategy
    if strategy == "auto":
        if "TF_CONFIG" in os.environ:
            strategy = "multi_worker"
            reasons["strategy"] = "TF_CONFIG is set: one replica set per worker"
        elif len(devices.gpus) > 1:
            strategy = "mirrored"
            reasons["strategy"] = f"{len(devices.gpus)} GPUs on this host: data parallel across them"
        else:
            strategy = "default"
            reasons["strategy"] = "one device"

    if jit_compile and strategy == "mirrored" and not devices.gpus and train.cpu_replicas > 1:
        # XLA compiles each replica's step for one CPU device and fails on the variables of the
        # others ("Trying to access resource ... located in device CPU:1 from device CPU:0").
        jit_compile = False
        reasons["jit_compile"] = (
            "off: XLA cannot compile a step mirrored over logical CPUs (variables on other devices)"
        )
    return Choices(precision, bool(jit_compile), int(steps), strategy, reasons)
