"""Every `auto` decided in one place: what a config becomes on this machine, and why.

What speeds up a modern NVIDIA GPU (float16 tensor cores, XLA fusion, many steps per host
round trip, augmentation next to the model) can slow a CPU down several-fold (the ladder's XLA
and mixed-precision rungs on the project's CPUs: docs/figures.md, "ladder"). So `auto` means "what is
fastest here", decided from the detected devices (devices.py) and the built dataset (its size
decides what to cache): precision, XLA, steps per execution, strategy, stall timeout here; the
workload's own (images: what to cache, where to shuffle, where to augment; text: the bucket
lengths) by the workload, asked here. Each choice comes with its reason; the run set-up writes
both into the run's config.yaml, and the benchmarks plan their variants the same way.

Two kinds of `auto` are left as they are, on purpose: pipeline.parallel_reads, parallel_calls
and prefetch `auto` is tf.data's AUTOTUNE (tf.data tunes them while the pipeline runs), and
train.warmup_steps `auto` depends on where a resumed run starts (`warmup_steps`, which the
loops call).
"""

from __future__ import annotations

import dataclasses
import os

import tensorflow as tf

from train import workloads
from train.config import Config, TrainConfig
from train.training.devices import Devices
from train.training.strategy import make_strategy


@dataclasses.dataclass(frozen=True)
class Choices:
    precision: str
    jit_compile: bool
    steps_per_execution: int
    strategy: str
    reasons: dict  # knob -> why it was chosen, for every `auto` decided here


def resolve(cfg: Config, found: Devices, spec) -> tuple[Config, Choices]:
    """`cfg` with every device- and data-dependent `auto` replaced by the choice for `found` and
    `spec`, and the choices with their reasons."""
    choices = train_choices(cfg.train, found)
    workload = workloads.get(cfg.workload)
    cfg, reasons = workload.resolve(cfg, spec, found)
    choices.reasons.update(reasons)
    stall = cfg.train.stall_timeout_s
    if stall == "auto":
        stall, choices.reasons["stall_timeout_s"] = stall_timeout(workload.data_service(cfg))
    train = dataclasses.replace(
        cfg.train,
        precision=choices.precision,
        jit_compile=choices.jit_compile,
        steps_per_execution=choices.steps_per_execution,
        strategy=choices.strategy,
        stall_timeout_s=float(stall),
    )
    return dataclasses.replace(cfg, train=train), choices


def stall_timeout(data_service: str | None) -> tuple[float, str]:
    """train.stall_timeout_s `auto`: how long the trainer waits for a batch before it stops, and why."""
    if data_service:
        return 300.0, "300 s: a tf.data service can lose its workers, and the trainer would wait for them forever"
    return 0.0, "off: the input pipeline runs in this process"


def train_choices(train: TrainConfig, found: Devices) -> Choices:
    """Precision, XLA, steps per execution and strategy for `found`; the reason for each `auto`."""
    reasons = {}
    precision = _precision(train.precision, found, reasons)
    jit_compile = train.jit_compile
    if jit_compile == "auto":
        jit_compile = bool(found.gpus)
        reasons["jit_compile"] = (
            "GPU: XLA fuses small kernels and cuts launch overhead"
            if found.gpus
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
    strategy = _strategy(train.strategy, found, reasons)
    if jit_compile and strategy == "mirrored" and not found.gpus and train.cpu_replicas > 1:
        # XLA compiles each replica's step for one CPU device and fails on the variables of the
        # others ("Trying to access resource ... located in device CPU:1 from device CPU:0").
        jit_compile = False
        reasons["jit_compile"] = (
            "off: XLA cannot compile a step mirrored over logical CPUs (variables on other devices)"
        )
    return Choices(precision, bool(jit_compile), int(steps), strategy, reasons)


def _precision(setting: str, found: Devices, reasons: dict) -> str:
    if setting == "mixed":
        reasons["precision"] = (
            "mixed: float16 on GPU" if found.gpus else "mixed: bfloat16 on CPU (asked for, though slower here)"
        )
        return "mixed_float16" if found.gpus else "mixed_bfloat16"
    if setting != "auto":
        return setting
    if found.gpus and min(found.compute_capabilities) >= (7, 0):
        reasons["precision"] = "GPU with tensor cores (compute capability >= 7.0): float16 math, float32 weights"
        return "mixed_float16"
    if found.gpus:
        reasons["precision"] = "GPU without tensor cores: float16 would not be faster"
        return "float32"
    if found.cpu_bf16:
        reasons["precision"] = (
            "CPU with bfloat16 units (avx512_bf16/amx_bf16): bfloat16 math, float32 "
            "weights (the ladder's mixed-precision rung measures the gain)"
        )
        return "mixed_bfloat16"
    reasons["precision"] = "CPU without bfloat16 units: float32 (mixed_bfloat16 was ~7x slower on such CPUs)"
    return "float32"


def _strategy(setting: str, found: Devices, reasons: dict) -> str:
    if setting != "auto":
        return setting
    if "TF_CONFIG" in os.environ:
        reasons["strategy"] = "TF_CONFIG is set: one replica set per worker"
        return "multi_worker"
    if len(found.gpus) > 1:
        reasons["strategy"] = f"{len(found.gpus)} GPUs on this host: data parallel across them"
        return "mirrored"
    reasons["strategy"] = "one device"
    return "default"


@dataclasses.dataclass
class Plan:
    """A config made concrete for this machine: every `auto` resolved, the strategy, the global batch."""

    cfg: Config
    choices: Choices
    strategy: tf.distribute.Strategy
    global_batch: int  # the per-replica batch size x replicas: what one step consumes
    steps_per_epoch: int  # train.steps_per_epoch, or one pass over the training split
    epoch_steps: int  # one pass over the training split (a cache fills in it)

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync


def plan(cfg: Config, found: Devices, spec) -> Plan:
    """Resolve `cfg` for `found` and `spec`, create its strategy (before any other TensorFlow op)
    and derive the global batch, checking that it fits the training split."""
    cfg, choices = resolve(cfg, found, spec)
    strategy = make_strategy(cfg)
    global_batch, epoch_steps = workloads.get(cfg.workload).batching(cfg, spec, strategy.num_replicas_in_sync)
    return Plan(cfg, choices, strategy, global_batch, cfg.train.steps_per_epoch or epoch_steps, epoch_steps)


def warmup_steps(setting: int | str, steps_per_epoch: int, epochs: int) -> int:
    """Steps left out of the steady-state figures; `auto`: the first of the `epochs` this process
    trains (tracing, autotuning and filling the cache happen there) when there are two or more."""
    if setting != "auto":
        return int(setting)
    return steps_per_epoch if epochs >= 2 else min(20, steps_per_epoch // 4)


def profile_window(cfg: Config, total_steps: int, steps_per_execution: int, filling: int = 0) -> int:
    """The first profiled step of this process: profile.start_step steps into the steady state, moved earlier when
    the run is too short to reach the window.

    `filling`: the steps in which the pipeline's cache fills (one pass over the training split; 0 without a cache).
    They decode what later epochs read from the cache, so a window in them shows work the run then stops doing (and
    the doctor would prescribe a cache that is already there): the window follows them where the run goes on long
    enough, as the step timer's warm-up leaves the first epoch out of the steady-state figures. The traced steps are
    left out of the timed ones (StepTimer), wherever the window falls.
    """
    needed = (cfg.profile.num_steps + 2) * steps_per_execution
    if filling and filling <= total_steps - needed:
        return min(filling + cfg.profile.start_step, total_steps - needed)
    return max(0, min(cfg.profile.start_step, total_steps - needed))
