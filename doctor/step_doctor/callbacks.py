"""Keras callbacks for a script of your own: TensorBoard profiles that xprof can analyse.

The stock Keras 3 TensorBoard callback marks profiled batches without the `_r=1` flag, so xprof
finds no step marker and reports no step time (openxla/xprof#578). StepTraceProfiler wraps each
profiled step in `Trace("train", step_num=..., _r=1)`, opened in `on_train_batch_begin` and
closed in `on_train_batch_end`; Keras fetches the batch between the two, so the marked step
covers waiting for input and running the step. This module imports TensorFlow and Keras (the
script's own); nothing else of the doctor does.

With `steps_per_execution = N` Keras calls the batch hooks once per N steps:
`on_train_batch_begin` sees 0, N, 2N, ... and `on_train_batch_end` sees N-1, 2N-1, ...
A `StepCallback` turns that into `self.step` (global steps before the current execution)
and the number of steps each execution ran, so no callback counts on its own.
"""

from __future__ import annotations

from pathlib import Path

import keras
import tensorflow as tf

from step_doctor.process_cpu import Window


class StepCallback(keras.callbacks.Callback):
    """Override `step_begin()` and `step_end(steps, logs)`; `self.step` and `self.epoch` are kept here."""

    def __init__(self, start_step: int = 0):
        super().__init__()
        self.step = start_step
        self.epoch = 0
        self._first_batch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self._first_batch = batch
        self.step_begin()

    def on_train_batch_end(self, batch, logs=None):
        steps = batch - self._first_batch + 1
        self.step_end(steps, logs or {})
        self.step += steps

    def step_begin(self) -> None:
        pass

    def step_end(self, steps: int, logs: dict) -> None:
        pass


class StepTraceProfiler(StepCallback):
    """Profile `num_steps` marked steps from `start_step` on into `logdir/plugins/profile`.

    With steps_per_execution = N a marked "step" is one execution of N steps. xprof leaves
    out the first and the last marked step (they may be cut by the capture window), so two
    more are traced than asked for.
    """

    def __init__(self, logdir: Path, start_step: int, num_steps: int):
        super().__init__()
        self.logdir = str(logdir)
        self.start_step = start_step
        self.num_steps = num_steps
        self.traced = 0
        self._state = "waiting"  # waiting -> active -> done
        self._trace = None
        self._cpu = Window()  # the process CPU of the window, beside the profile (the doctor's estimates read it)

    def step_begin(self):
        # Starting and stopping the profiler happen here, before StepTimer reads its clock.
        if self._state == "active" and self.traced >= self.num_steps + 2:
            self._stop()
        if self._state == "waiting" and self.step >= self.start_step:
            tf.profiler.experimental.start(self.logdir)
            self._state = "active"
            self._cpu.start()
        if self._state == "active":
            self._trace = tf.profiler.experimental.Trace("train", step_num=self.step, _r=1)
            self._trace.__enter__()

    @property
    def tracing(self) -> bool:
        """Whether the step that began last is traced (read after this callback's step_begin: a timer left out)."""
        return self._trace is not None

    def step_end(self, steps, logs):
        if self._trace is not None:
            self._trace.__exit__(None, None, None)
            self._trace = None
            self.traced += 1

    def on_train_end(self, logs=None):
        if self._state == "active":
            self._stop()

    def _stop(self):
        self._cpu.stop()
        tf.profiler.experimental.stop()
        self._state = "done"
        self._cpu.write(self.logdir)
