"""What this machine has: GPUs (name, compute capability), CPU cores and bfloat16 units; and
splitting the CPU into logical devices to mirror over where there is no GPU.

The choices made from what is found (every `auto`) are made in plan.py.
"""

from __future__ import annotations

import dataclasses
import os

import tensorflow as tf

from step_doctor.machine import cpu_bf16, cpu_model
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
        cpu_bf16=cpu_bf16(),
    )


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
