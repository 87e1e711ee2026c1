"""What a text run's steps cost in tokens: real tokens/s, padded slots/s, padding share, the distinct input
shapes, XLA compiles and the seconds they took. The figures of train/workloads/text/figures.py, taken during training.

Examples/s says little for text: a bucketed batch holds 32 to 256 texts, and a padded one mostly padding.
So the training dataset ends in a map that adds each batch's real tokens, slots and texts to a variable as
the train step takes the batch (the map runs inside the step's GetNext: nothing counted waits in a buffer),
and records the batch's shape. `TextFigures`, a callback, reads them after every execution, adds the
steady-state steps' counts to their step time (warm-up excluded, as StepTimer does) and notes the first
step of every new shape: with XLA that step compiles, so its excess over the shape's usual step time is the
compile's cost. The compiles themselves are counted from an XLA dump of the run (`xla_dump`), one module per
compile.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import statistics
import time
from pathlib import Path

import keras
import tensorflow as tf

from train.core import files
from train.workloads.text import figures

# the run's figures written as TensorBoard scalars (text/run_<key>, step 0) besides the per-epoch ones
SCALARS = (
    "real_tokens_per_s",
    "padded_slots_per_s",
    "padding_share",
    "texts_per_s",
    "distinct_shapes",
    "xla_compiles",
    "compile_seconds",
)
SHAPE_STEPS_KEPT = 50  # step times kept per shape, for its usual (median) step time


class TokenCounter:
    """Variables that a training dataset's last map updates: totals and the last batch's shape."""

    def __init__(self):
        # real tokens, slots, texts, batches
        self.totals = tf.Variable(tf.zeros([4], tf.float64), trainable=False, name="text_totals")
        self.shape = tf.Variable(tf.zeros([2], tf.int64), trainable=False, name="text_batch_shape")

    def wrap(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        def count(*batch):
            ids = figures.token_ids_of(batch)
            texts = tf.reduce_sum(tf.cast(batch[2], tf.float64)) if len(batch) == 3 else tf.shape(batch[1])[0]
            shape = tf.shape(ids, out_type=tf.int64)
            row = tf.stack(
                [
                    tf.cast(tf.math.count_nonzero(ids), tf.float64),
                    tf.cast(tf.size(ids), tf.float64),
                    tf.cast(texts, tf.float64),
                    tf.constant(1.0, tf.float64),
                ]
            )
            with tf.control_dependencies([self.totals.assign_add(row), self.shape.assign(shape)]):
                return tf.nest.map_structure(tf.identity, batch)

        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False  # no buffer between the count and the step
        absl = logging.getLogger("absl")  # TensorFlow's warnings go through absl to this logger
        level = absl.level
        absl.setLevel(logging.ERROR)  # "Changing the value of option inject_prefetch": meant
        try:
            return dataset.map(count).with_options(options)
        finally:
            absl.setLevel(level)

    def read(self) -> tuple[list[float], tuple[int, int]]:
        return [float(v) for v in self.totals.numpy()], tuple(int(v) for v in self.shape.numpy())

    def count(self) -> float:
        """The real tokens counted so far: what a text benchmark's rate counts."""
        return float(self.totals[0].numpy())


class TextFigures(keras.callbacks.Callback):
    """Per execution: the tokens it consumed, its time, its batch shape; per epoch and at the end, the figures."""

    def __init__(self, counter: TokenCounter, warmup_steps: int, logdir: Path | None, jit_compile: bool, profiler=None):
        super().__init__()
        self.counter, self.warmup_steps, self.logdir, self.jit_compile = counter, warmup_steps, logdir, jit_compile
        self.profiler = profiler  # its traced steps are left out of the steady state, as StepTimer leaves them out
        self._traced = False
        self.step = 0
        self.steady = [0.0, 0.0, 0.0, 0.0]  # real tokens, slots, texts, batches after warm-up
        self.steady_seconds = 0.0
        self.every = [0.0, 0.0, 0.0, 0.0]  # the same over every step (a run too short for a steady state)
        self.every_seconds = 0.0
        self.epoch_counts = [0.0, 0.0, 0.0, 0.0]
        self.epoch_seconds = 0.0
        self.first_step_s: dict[tuple, float] = {}  # shape -> the seconds of its first step
        self.step_s: dict[tuple, list] = {}  # shape -> later steps' seconds (the first SHAPE_STEPS_KEPT)
        self._last = None
        self._writer = None

    def on_train_begin(self, logs=None):
        self._last = self.counter.read()[0]
        if self.logdir is not None:
            self._writer = files.scalar_writer(self.logdir, ".text")

    def on_train_batch_begin(self, batch, logs=None):
        self._traced = self.profiler is not None and self.profiler.tracing
        self._started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        seconds = time.perf_counter() - self._started
        totals, shape = self.counter.read()
        delta = [now - before for now, before in zip(totals, self._last)]
        self._last = totals
        steps = max(1, int(round(delta[3])))
        if shape not in self.first_step_s:
            self.first_step_s[shape] = seconds
        elif len(self.step_s.setdefault(shape, [])) < SHAPE_STEPS_KEPT:
            self.step_s[shape].append(seconds)
        self.epoch_counts = [a + b for a, b in zip(self.epoch_counts, delta)]
        self.epoch_seconds += seconds
        self.every = [a + b for a, b in zip(self.every, delta)]
        self.every_seconds += seconds
        if self.step >= self.warmup_steps and not self._traced:
            self.steady = [a + b for a, b in zip(self.steady, delta)]
            self.steady_seconds += seconds
        self.step += steps

    def on_epoch_end(self, epoch, logs=None):
        if self._writer is not None and self.epoch_seconds:
            rates = _rates(self.epoch_counts, self.epoch_seconds)
            with self._writer.as_default(step=epoch):
                for key in ("real_tokens_per_s", "padded_slots_per_s", "padding_share", "texts_per_s"):
                    tf.summary.scalar(f"text/{key}", rates[key])
                tf.summary.scalar("text/distinct_shapes", len(self.first_step_s))
            self._writer.flush()
        self.epoch_counts, self.epoch_seconds = [0.0, 0.0, 0.0, 0.0], 0.0

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def compile_seconds(self) -> float:
        """The first steps' excess over their shape's usual step time: tracing, and with XLA the compiles."""
        excess = 0.0
        for shape, first in self.first_step_s.items():
            later = self.step_s.get(shape)
            usual = statistics.median(later) if later else 0.0
            excess += max(0.0, first - usual)
        return excess

    def summary(self, xla_compiles: int | None) -> dict:
        """The text figures of the run (steady state where there was one, else every step)."""
        steady = bool(self.steady[3])
        counts, seconds = (self.steady, self.steady_seconds) if steady else (self.every, self.every_seconds)
        rates = _rates(counts, seconds)
        return {
            **rates,
            "warmup_excluded": steady,
            "real_tokens": int(counts[0]),
            "padded_slots": int(counts[1] - counts[0]),
            "texts_per_step": counts[2] / counts[3] if counts[3] else None,
            "real_tokens_per_step": counts[0] / counts[3] if counts[3] else None,
            "distinct_shapes": len(self.first_step_s),
            "shapes": [f"{rows}x{length}" for rows, length in sorted(self.first_step_s, key=lambda s: (s[1], s[0]))],
            "jit_compile": self.jit_compile,
            "xla_compiles": xla_compiles,
            "compile_seconds": self.compile_seconds() if self.jit_compile else None,
            "first_step_seconds": self.compile_seconds() if not self.jit_compile else None,
        }


class TextMeter:
    """What a text run measures beside step time (the workload's `meter`): the counting map at the end of the
    training dataset (`wrap`), the callback that reads it (`callback`), the XLA dump of the chief's compiles,
    and at the end the figures (`finish`), also written as TensorBoard scalars (text/run_*)."""

    def __init__(self, warmup_steps: int, logdir: Path, jit_compile: bool, run_dir: Path, chief: bool, profiler=None):
        self.counter = TokenCounter()
        self.callback = TextFigures(self.counter, warmup_steps, logdir, jit_compile, profiler)
        self.logdir = logdir
        self.xla_dump = start_xla_dump(run_dir) if jit_compile and chief else None

    def wrap(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return self.counter.wrap(dataset)

    def finish(self) -> tuple[dict, float | None]:
        """(the run's text figures, the texts consumed per second: its examples/s)."""
        figures = self.callback.summary(count_xla_compiles(self.xla_dump))
        points = [(f"text/run_{key}", figures[key], 0) for key in SCALARS if figures.get(key) is not None]
        files.write_scalars(self.logdir, points, ".text_run")
        return figures, figures.get("texts_per_s") or None


def _rates(counts: list[float], seconds: float) -> dict:
    per = 1.0 / seconds if seconds else 0.0
    real, slots, texts, _ = counts
    return {
        "real_tokens_per_s": real * per,
        "padded_slots_per_s": (slots - real) * per,
        "slots_per_s": slots * per,
        "texts_per_s": texts * per,
        "padding_share": (slots - real) / slots if slots else None,
    }


def start_xla_dump(run_dir: Path) -> Path | None:
    """Dump every XLA compile of this process into run_dir/xla_dump (XLA reads XLA_FLAGS at its first compile,
    so this works after TensorFlow is imported). None where the user's own XLA_FLAGS dump elsewhere."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_dump_to" in flags:
        return None
    folder = Path(run_dir) / "xla_dump"
    shutil.rmtree(folder, ignore_errors=True)
    os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={folder}".strip()
    return folder


def count_xla_compiles(folder: Path | None, keep: bool = False) -> int | None:
    """Compiles of the train step in a dump (one module per compile, its stages counted once); the dump,
    large for a real model, is removed unless `keep`."""
    if folder is None or not folder.is_dir():
        return None if folder is None else 0
    modules = {path.name.split(".", 1)[0]: path.name for path in folder.glob("module_*.txt")}
    count = sum(bool(re.search(r"one_step_on|multi_step_on|train_function", name)) for name in modules.values())
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
    return count
