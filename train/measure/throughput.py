"""Examples per second and step time, measured the way benchmarks should: warm-up excluded.

Keras fetches the next batch inside the train function, between `on_train_batch_begin`
and `on_train_batch_end`, so the time between those two hooks is the whole step: waiting
for input plus compute. With `steps_per_execution = N` the hooks fire once per N steps.
"""

from __future__ import annotations

import time
from pathlib import Path

import tensorflow as tf

from step_doctor.callbacks import StepCallback, StepTraceProfiler
from train.core import files


class StepTimer(StepCallback):
    """Times every training execution; writes examples/s and step time per epoch to TensorBoard."""

    def __init__(
        self,
        global_batch: int,
        warmup_steps: int,
        logdir: Path | None = None,
        fixed_batch: bool = True,
        profiler: StepTraceProfiler | None = None,
    ):
        super().__init__()
        # Steps the profiler traces run slower (its tracing is their cost, not the run's): left out like warm-up. It
        # is a callback before this one, so at this one's step_begin it says whether the step is traced.
        self.profiler = profiler
        self._traced = False
        self.traced_records: list[tuple[int, int, float]] = []
        self.batch_size = global_batch
        # Where a workload's batches hold different numbers of examples (text: bucketed or packed rows), examples/s
        # from the nominal batch would be wrong: only the step time is written (its meter counts what was consumed).
        self.fixed_batch = fixed_batch
        self.warmup_steps = warmup_steps
        self.logdir = logdir
        self.records: list[tuple[int, int, float]] = []  # (epoch, steps, seconds) after warm-up
        self.warmup_records: list[tuple[int, int, float]] = []
        self.steady_since: float | None = None  # wall-clock time when warm-up ended
        self._writer = None

    def on_train_begin(self, logs=None):
        if self.logdir is not None:
            self._writer = files.scalar_writer(self.logdir, ".throughput")

    def step_begin(self):
        self._traced = self.profiler is not None and self.profiler.tracing
        self._started = time.perf_counter()

    def step_end(self, steps, logs):
        seconds = time.perf_counter() - self._started
        if self._traced:
            self.traced_records.append((self.epoch, steps, seconds))
        elif self.step >= self.warmup_steps:
            if self.steady_since is None:
                self.steady_since = time.time() - seconds
            self.records.append((self.epoch, steps, seconds))
        else:
            self.warmup_records.append((self.epoch, steps, seconds))

    def on_epoch_end(self, epoch, logs=None):
        rows = [r for r in self.records if r[0] == epoch] or [
            r for r in self.warmup_records + self.traced_records if r[0] == epoch
        ]
        if self._writer is None or not rows:
            return
        steps, seconds = sum(r[1] for r in rows), sum(r[2] for r in rows)
        with self._writer.as_default(step=epoch):
            if self.fixed_batch:
                tf.summary.scalar("examples_per_sec", steps * self.batch_size / seconds)
            tf.summary.scalar("step_time_ms", 1000 * seconds / steps)
        self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()

    def _rate(self, rows) -> float | None:
        steps, seconds = sum(r[1] for r in rows), sum(r[2] for r in rows)
        return steps * self.batch_size / seconds if steps and seconds else None

    def summary(self) -> dict:
        """Steady state (after warm-up), plus the overall and per-epoch rates for transparency."""
        rows = self.records or self.warmup_records or self.traced_records  # a run too short for the others
        steps, seconds = sum(r[1] for r in rows), sum(r[2] for r in rows)
        everything = self.warmup_records + self.records + self.traced_records
        epochs = sorted({r[0] for r in everything})
        return {
            "examples_per_sec": self._rate(rows),
            "step_time_ms": 1000 * seconds / steps if steps else None,
            "measured_steps": steps,
            "warmup_excluded": bool(self.records),
            "profiled_steps_excluded": sum(r[1] for r in self.traced_records),
            "examples_per_sec_overall": self._rate(everything),
            "epoch_examples_per_sec": [self._rate([r for r in everything if r[0] == e]) for e in epochs],
        }
