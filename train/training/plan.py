"""Every `auto` decided in one place: what a config becomes on this machine, and why.

What speeds up a modern NVIDIA GPU (float16 tensor cores, XLA fusion, many steps per host
round trip, augmentation next to the model) can slow a CPU down: on the project's 2-core CPUs
XLA made a small CNN 2-4x slower and mixed_bfloat16 about 7x slower. So `auto` means "what is
fastest here", decided from the detected devices (devices.py) and the built dataset (its size
decides what to cache): precision, XLA, steps per execution, strategy, stall timeout; what to
cache, where to shuffle, where to augment. Each choice comes with its reason; the run set-up
writes both into the run's config.yaml, and the benchmarks plan their variants the same way.

Two kinds of `auto` are left as they are, on purpose: pipeline.parallel_reads, parallel_calls
and prefetch `auto` is tf.data's AUTOTUNE (tf.data tunes them while the pipeline runs), and
train.warmup_steps `auto` depends on where a resumed run starts (`warmup_steps`, which the
loops call).
"""

from __future__ import annotations

import dataclasses
import os

import tensorflow as tf

from train.config import Config, PipelineConfig, TrainConfig
from train.core.errors import UserError
from train.input import pipeline
from train.shards.spec import DatasetSpec
from train.training.devices import Devices
from train.training.strategy import make_strategy
from train.workloads.text import pipeline as text_pipeline


@dataclasses.dataclass(frozen=True)
class Choices:
    precision: str
    jit_compile: bool
    steps_per_execution: int
    strategy: str
    reasons: dict  # knob -> why it was chosen, for every `auto` decided here


def resolve(cfg: Config, found: Devices, spec: DatasetSpec) -> tuple[Config, Choices]:
    """`cfg` with every device- and data-dependent `auto` replaced by the choice for `found` and
    `spec`, and the choices with their reasons."""
    choices = train_choices(cfg.train, found)
    if cfg.task == "text":
        # the bucket lengths from the built dataset's length histogram, the pack length from its longest text
        text_knobs, reasons = text_pipeline.resolve(cfg.text.pipeline, spec)
        if cfg.train.deterministic and not text_knobs.deterministic:
            text_knobs = dataclasses.replace(text_knobs, deterministic=True)
        knobs, service = cfg.pipeline, None
        cfg = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, pipeline=text_knobs))
    else:
        knobs, reasons = pipeline_choices(cfg.pipeline, spec, gpu=bool(found.gpus))
        if cfg.train.deterministic and not knobs.deterministic:
            knobs = dataclasses.replace(knobs, deterministic=True)
        service = knobs.data_service
    choices.reasons.update(reasons)
    stall = cfg.train.stall_timeout_s
    if stall == "auto":
        stall, choices.reasons["stall_timeout_s"] = stall_timeout(service)
    train = dataclasses.replace(
        cfg.train,
        precision=choices.precision,
        jit_compile=choices.jit_compile,
        steps_per_execution=choices.steps_per_execution,
        strategy=choices.strategy,
        stall_timeout_s=float(stall),
    )
    return dataclasses.replace(cfg, pipeline=knobs, train=train), choices


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


def pipeline_choices(
    knobs: PipelineConfig, spec: DatasetSpec, gpu: bool, num_examples: int | None = None
) -> tuple[PipelineConfig, dict]:
    """`knobs` with what to cache, where to shuffle and where to augment decided for `spec` (sized
    for `num_examples`, by default its training split) and the device; the reason for each `auto`."""
    num_examples = spec.num_train if num_examples is None else num_examples
    reasons = {}
    augment = knobs.augment
    if augment == "auto":
        augment = "device" if gpu else "batched"
        reasons["pipeline.augment"] = (
            "GPU: flips and shift run on the accelerator, at the start of the model"
            if gpu
            else "no GPU: vectorized on the host, one map per batch (the model shares these cores anyway)"
        )
    cache = knobs.cache
    if cache == "auto":
        cache, why = _cache(dataclasses.replace(knobs, augment=augment), spec, num_examples)
        reasons["pipeline.cache"] = cache + ": " + why
    before = knobs.shuffle_before_decode
    if before == "auto":
        before = cache in ("encoded", "none") and knobs.reader == "tfrecord"
        reasons["pipeline.shuffle_before_decode"] = (
            "nothing decoded is cached: shuffle the records, a buffer of JPEG bytes instead of pixels"
            if before
            else f"decoded images are cached ({cache}): shuffle them after the cache"
        )
    return dataclasses.replace(knobs, augment=augment, cache=cache, shuffle_before_decode=bool(before)), reasons


def _cache(knobs: PipelineConfig, spec: DatasetSpec, num_examples: int) -> tuple[str, str]:
    """What to keep between epochs, and why: the first of decoded in memory, decoded on disk,
    encoded in memory that the limit and the knobs allow."""
    decoded = pipeline.cache_size_mb(dataclasses.replace(knobs, cache="memory"), spec, num_examples)
    encoded = pipeline.encoded_size_mb(spec, num_examples)
    limit = knobs.cache_limit_mb
    if knobs.augment == "python":
        return "none", "the generator augments: a cache after it would keep the first epoch's flips and shifts"
    if knobs.reader == "python":
        why = f"the Python generator's decoded images ({decoded:.0f} MB), limit {limit} MB"
        return ("memory" if decoded <= limit else "none"), why
    if knobs.random_crop:
        why = f"random_crop decodes a new window every epoch: encoded records ({encoded:.0f} MB)"
        return ("encoded" if encoded <= limit else "none"), why
    if decoded <= limit:
        return "memory", f"decoded images ({decoded:.0f} MB) fit in cache_limit_mb ({limit})"
    if knobs.cache_dir:
        on_disk = pipeline.decoded_size_mb(spec, knobs, num_examples)  # a snapshot stores no mirrors
        why = f"decoded images exceed cache_limit_mb ({limit}): a {on_disk:.0f} MB snapshot in {knobs.cache_dir}"
        return "disk", why
    if encoded <= limit:
        why = f"decoded images ({decoded:.0f} MB) exceed cache_limit_mb ({limit}); the records ({encoded:.0f} MB) fit"
        return "encoded", why
    return "none", f"neither decoded ({decoded:.0f} MB) nor encoded ({encoded:.0f} MB) fit in {limit} MB"


@dataclasses.dataclass
class Plan:
    """A config made concrete for this machine: every `auto` resolved, the strategy, the global batch."""

    cfg: Config
    choices: Choices
    strategy: tf.distribute.Strategy
    global_batch: int  # pipeline.batch_size (per replica) x replicas: what one step consumes
    steps_per_epoch: int  # train.steps_per_epoch, or one pass over the training split

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync


def plan(cfg: Config, found: Devices, spec: DatasetSpec) -> Plan:
    """Resolve `cfg` for `found` and `spec`, create its strategy (before any other TensorFlow op)
    and derive the global batch, checking that it fits the training split."""
    cfg, choices = resolve(cfg, found, spec)
    strategy = make_strategy(cfg)
    replicas = strategy.num_replicas_in_sync
    if cfg.task == "text":
        # rows per batch for pad_max and pad_batch; bucket and pack batches are sized by text.pipeline.token_budget
        global_batch = cfg.text.pipeline.batch_size * replicas
        knobs = dataclasses.replace(cfg.text.pipeline, batch_size=global_batch)
        steps = cfg.train.steps_per_epoch or text_pipeline.steps_per_epoch(knobs, spec)
        return Plan(cfg, choices, strategy, global_batch, steps)
    check_batch_size(cfg, spec, replicas)
    global_batch = cfg.pipeline.batch_size * replicas
    steps = cfg.train.steps_per_epoch or pipeline.steps_per_epoch(
        spec.num_train, global_batch, cfg.pipeline.drop_remainder
    )
    return Plan(cfg, choices, strategy, global_batch, steps)


def check_batch_size(cfg: Config, spec: DatasetSpec, replicas: int) -> None:
    knobs = cfg.pipeline
    if knobs.drop_remainder and knobs.batch_size * replicas > spec.num_train:
        raise UserError(
            f"pipeline.batch_size ({knobs.batch_size}"
            + (f" per replica, {knobs.batch_size * replicas} over {replicas} replicas" if replicas > 1 else "")
            + f") is larger than the training split of {spec.root} ({spec.num_train} examples), so drop_remainder "
            "would leave no batch at all. Lower pipeline.batch_size or set pipeline.drop_remainder=false."
        )


def warmup_steps(setting: int | str, steps_per_epoch: int, epochs: int) -> int:
    """Steps left out of the steady-state figures; `auto`: the first of the `epochs` this process
    trains (tracing, autotuning and filling the cache happen there) when there are two or more."""
    if setting != "auto":
        return int(setting)
    return steps_per_epoch if epochs >= 2 else min(20, steps_per_epoch // 4)
