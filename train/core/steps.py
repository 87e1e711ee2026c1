"""Counting training steps in Keras callbacks, the same way in every callback.

With `steps_per_execution = N` Keras calls the batch hooks once per N steps:
`on_train_batch_begin` sees 0, N, 2N, ... and `on_train_batch_end` sees N-1, 2N-1, ...
A `StepCallback` turns that into `self.step` (global steps before the current execution)
and the number of steps each execution ran, so no callback counts on its own.
"""

from __future__ import annotations

import keras


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
