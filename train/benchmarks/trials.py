"""Benchmark trials: one variant made ready to run, warm-up excluded, measured trial by trial.

A `Variant` is one config made ready to run: its pipeline, its compiled model and one
iterator that lives across trials (so caches stay filled and no trial pays for starting
or tearing down a pipeline). A trial calls the model's compiled train function, the same
one `model.fit` calls each step, for at least `seconds` and returns examples/s. The
benchmarks run each Variant in a process of its own (worker.py, isolated.py), so that
variants measured in turns cannot disturb each other; `begin` sets a benchmark up.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

from step_doctor.diagnose import analysis
from train import scenario as scenario_lib
from train import workloads
from train.benchmarks import stats
from train.config import Config
from train.training import devices, plan
from train.training.compiled_model import build_model

PREROLL_S = 0.25  # untimed steps before each trial ...
PREROLL_CALLS = 2  # ... and at least this many executions
EPOCH_ALIGN_MAX_S = 20.0  # trials run whole epochs when one takes at most this long


@dataclasses.dataclass
class Variant:
    name: str
    cfg: Config
    choices: plan.Choices
    model: object
    iterator: object
    batch_size: int  # the global batch: examples per step over every replica
    description: str
    samples: list[float] = dataclasses.field(default_factory=list)
    warmup_seconds: float = 0.0
    epoch_calls: int = 0  # executions per epoch of the training split (0: not known)
    make_iterator: Callable[[], object] | None = None  # a fresh iterator over the same pipeline (renew)
    fills_cache: bool = False  # the pipeline caches: its first epoch fills (or opens) the cache
    min_warmup_seconds: float = 2.0
    # what a trial's rate counts (the workload's unit); where the workload has a counter (text: real tokens), the
    # dataset's last map counts what the steps consume, else a step consumes the global batch of examples
    unit: str = "examples/s"
    counter: object = None

    @property
    def replicas(self) -> int:
        return self.model.distribute_strategy.num_replicas_in_sync

    @property
    def steps_per_call(self) -> int:
        return self.choices.steps_per_execution

    def run(self, calls: int) -> float:
        """Run `calls` executions; return the seconds they took."""
        started = time.perf_counter()
        for _ in range(calls):
            logs = self.model.train_function(self.iterator)
        # The step is asynchronous on accelerators: wait for its result before stopping the clock.
        float(next(iter(logs.values())))
        return time.perf_counter() - started

    def trial(self, seconds: float, min_calls: int = 3) -> float:
        """examples/s over at least `seconds` (and `min_calls` executions) and whole epochs, after a
        short untimed pre-roll. In a worker that was stopped while other variants ran (isolated.py),
        the pre-roll lets its threads resume; where a variant shares a process with others, it
        drains what its pipeline prepared while they ran (a head start, not the steady state).

        Whole epochs where one takes at most EPOCH_ALIGN_MAX_S: the cost of a step is not the same
        across an epoch (a shuffle buffer refills by decoding at the start of each epoch and drains
        without decoding at its end: the naive pipeline's half-second trials read 260 to 2,200
        images/s), and a trial of whole epochs sees every part of it once.
        """
        started, drained = time.perf_counter(), 0
        while time.perf_counter() - started < PREROLL_S or drained < PREROLL_CALLS:
            self.run(1)
            drained += 1
        counted_before = self.counter.count() if self.counter is not None else 0.0
        calls, elapsed, chunk = 0, 0.0, 1
        while elapsed < seconds or calls < min_calls or not self._whole_epochs(calls, elapsed):
            step = min(chunk, self._to_epoch_end(calls)) if elapsed >= seconds else chunk
            took = self.run(step)
            elapsed, calls = elapsed + took, calls + step
            if took < 0.25:  # grow chunks to about 0.25 s: one host sync per chunk, not per step
                chunk = max(chunk, int(step * 0.25 / max(took, 1e-6)))
        rate = calls * self.steps_per_call * self.batch_size / elapsed
        if self.counter is not None:
            rate = (self.counter.count() - counted_before) / elapsed
        self.samples.append(rate)
        return rate

    def _whole_epochs(self, calls: int, elapsed: float) -> bool:
        if not self.epoch_calls or not calls or self.epoch_calls * elapsed / calls > EPOCH_ALIGN_MAX_S:
            return True
        return calls % self.epoch_calls == 0

    def _to_epoch_end(self, calls: int) -> int:
        return (self.epoch_calls - calls % self.epoch_calls) if self.epoch_calls else 1 << 30

    def profile(self, logdir: Path, num_steps: int = 8) -> dict | None:
        """A short profile with step markers, analysed by xprof; None when it cannot be read."""
        tf.profiler.experimental.start(str(logdir))
        try:
            for step in range(num_steps + 2):  # xprof leaves out the first and last marked step
                with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
                    logs = self.model.train_function(self.iterator)
                    float(next(iter(logs.values())))
        finally:
            tf.profiler.experimental.stop()
        try:
            found = analysis.analyze_run(logdir)
        except analysis.ProfileError:
            return None
        return found.to_json() if found else None

    def stats(self) -> dict:
        return stats.summarize(self.samples)

    def renew(self) -> float:
        """Drop the pipeline's iterator and warm up a fresh one (the compiled model is kept); returns the
        warm-up's seconds. A pipeline's state grows with its life, not with its config: tf.data's prefetch
        autotuning only ever doubles its buffer (measured: 1, 2, 4, then 8 batches over a larger-than-memory
        variant's first minute of trials), and process memory grows with it. Renewing every variant of a
        comparison at its start gives them pipelines of the same age: bench-check's A/A."""
        if self.make_iterator is None:
            return 0.0
        self.iterator = None  # its buffers (and any tf.data service job) go before the new one starts
        self.iterator = self.make_iterator()
        self.warmup_seconds = warm_up(self)
        return self.warmup_seconds


def training_pipeline(made: plan.Plan, spec):
    """The training split's pipeline of a planned config, batched at its global batch."""
    return workloads.get(made.cfg.workload).build_dataset(
        made.cfg, spec, split="train", training=True, batch_size=made.global_batch, seed=made.cfg.train.seed
    )


SETTLE_WINDOW_S = 1.0  # warm-up goes on in windows of this length ...
SETTLE_GAIN = 0.05  # ... while a window is this much faster than every window before it ...
SETTLE_MAX_S = 30.0  # ... for at most this long in all


def settle(variant: Variant, deadline: float) -> None:
    """Run until the variant stops getting faster: a fresh pipeline's autotuning raises its parallelism
    and buffers over seconds (a fresh larger-than-memory pipeline ran at 330-380 images/s for 4 s,
    1,200 once settled), and a variant measured before it has settled reads slower as a new
    candidate than it does later as a long-running base."""
    best = 0.0
    while time.perf_counter() < deadline:
        window, calls, began = 0.0, 0, time.perf_counter()
        while window < SETTLE_WINDOW_S or calls < 3:
            window += variant.run(1)
            calls += 1
        rate = calls / (time.perf_counter() - began)
        if rate <= best * (1 + SETTLE_GAIN):
            return
        best = max(best, rate)


def warm_up(variant: Variant) -> float:
    """A fresh iterator's warm-up: a full epoch when the pipeline caches (the cache fills there), at least
    `min_warmup_seconds`, then until it stops getting faster (`settle`). Returns its seconds."""
    started = time.perf_counter()
    variant.run(variant.epoch_calls + 1 if variant.fills_cache else 3)
    while time.perf_counter() - started < variant.min_warmup_seconds:
        variant.run(1)
    settle(variant, started + SETTLE_MAX_S)
    return time.perf_counter() - started


def prepare(
    name: str,
    cfg: Config,
    spec,
    found: devices.Devices,
    *,
    ceiling: bool = False,
    warmup_seconds: float = 2.0,
    log: Callable[[str], None] = print,
) -> Variant:
    """Set up (as a run is: training/prepare_run.py), compile and warm up one variant.

    Warm-up runs at least one full epoch when the pipeline caches (the cache fills there), at
    least `warmup_seconds`, then until the variant stops getting faster (`settle`), so tracing,
    compilation and autotuning are all behind it.
    `ceiling=True` feeds the model the workload's batches from memory (`Workload.ceiling`): the
    same model with zero input cost. A config with several replicas (train.strategy: mirrored)
    really runs on them: the batches are distributed like `model.fit` distributes them.
    """
    made = plan.plan(cfg, found, spec)
    cfg, choices, strategy, replicas, batch_size = (
        made.cfg,
        made.choices,
        made.strategy,
        made.replicas,
        made.global_batch,
    )
    workload = workloads.get(cfg.workload)
    dataset = training_pipeline(made, spec)
    if ceiling:
        dataset, description = workload.ceiling(dataset, made.epoch_steps, batch_size)
    else:
        description = workload.describe_pipeline(cfg, spec, batch_size)
    counter = workload.counter()
    if counter is not None:
        dataset = counter.wrap(dataset)
    if replicas > 1:
        dataset = strategy.experimental_distribute_dataset(dataset)
        description += f" over {replicas} replicas"

    def make_iterator():
        return iter(dataset)  # a new iterator starts the whole pipeline afresh: buffers, autotuning, caches opened

    model = build_model(cfg, spec, choices, strategy)
    with strategy.scope():
        # `fit` builds the optimizer's variables before its first step; the compiled train function,
        # called directly, would create them inside a replica's step, which a strategy does not allow.
        model.optimizer.build(model.trainable_variables)
    model.make_train_function()
    variant = Variant(name, cfg, choices, model, make_iterator(), batch_size, description)
    variant.unit, variant.counter = workload.unit.label, counter
    variant.epoch_calls = 0 if ceiling else -(-made.epoch_steps // choices.steps_per_execution)
    variant.fills_cache = workload.caches(cfg) and not ceiling  # the first epoch fills it
    variant.min_warmup_seconds = warmup_seconds
    variant.make_iterator = make_iterator
    variant.warmup_seconds = warm_up(variant)
    log(
        f"  ready: {name} ({description}; precision {choices.precision}, XLA {choices.jit_compile}, "
        f"{choices.steps_per_execution} steps/execution) after {variant.warmup_seconds:.1f} s of warm-up"
    )
    return variant


def pipeline_cost(cfg: Config, spec, found: devices.Devices, seconds: float = 3.0) -> dict:
    """The input pipeline alone, without the model (the workload's `pipeline_cost`): CPU time per unit of work,
    and memory; caches filled first (one epoch), as in the trials."""
    made = plan.plan(cfg, found, spec)
    workload = workloads.get(made.cfg.workload)
    return workload.pipeline_cost(made.cfg, spec, made.global_batch, made.epoch_steps, seconds)


def begin(scenario: scenario_lib.Scenario, configs: list[Config], out: Path | None = None, clean: bool = False):
    """Say which scenario runs, build the dataset, set the devices up; returns (spec, found devices).

    TensorFlow fixes its devices at first use, so a CPU split for mirrored variants
    (train.cpu_replicas) happens here, before any variant is built.
    """
    print(scenario.why + ".", flush=True)
    spec, built = workloads.get(configs[0].workload).prepare_data(configs[0])
    if built:
        print(f"Built the dataset at {spec.root}.", flush=True)
    mirrored = [cfg.train.cpu_replicas for cfg in configs if cfg.train.strategy == "mirrored"]
    if mirrored and max(mirrored) > 1 and not scenario_lib.has_gpu():
        devices.split_cpu(max(mirrored))
    found = devices.detect()
    if out is not None:
        output_folder(out, clean)
    return spec, found


def output_folder(out: Path, clean: bool = False) -> None:
    """The run's output folder, emptied first where `clean` (a new run replaces the last one's results)."""
    if clean and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
