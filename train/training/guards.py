"""Guard rails: a loss that is no longer a number, a batch that does not fit in memory, a stalled run."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from pathlib import Path

import keras

from train.errors import UserError
from train.measure.steps import StepCallback


class NanGuard(StepCallback):
    """Stops training at the first step whose loss is NaN or infinite.

    It sets `model.stop_training`, which the Checkpointer (after it in the callback list)
    honours by saving nothing more, so the last checkpoint is the last good state.
    """

    def __init__(self, start_step: int = 0):
        super().__init__(start_step)
        self.tripped: dict | None = None

    def step_end(self, steps, logs):
        loss = logs.get("loss")
        if loss is not None and self.tripped is None and not math.isfinite(float(loss)):
            self.tripped = {"epoch": self.epoch, "global_step": self.step + steps, "loss": float(loss)}
            self.model.stop_training = True


def nan_error(tripped: dict, last_checkpoint: str | None, learning_rate: float) -> UserError:
    kept = (
        f"The last good checkpoint is kept at {last_checkpoint}."
        if last_checkpoint
        else "No checkpoint was saved before it."
    )
    return UserError(
        f"The loss became {tripped['loss']} at step {tripped['global_step']} (epoch {tripped['epoch'] + 1}); "
        f"training stopped there instead of going on with broken weights. {kept} Usual causes: a learning rate "
        f"too high for this model (train.learning_rate is {learning_rate}; try a tenth of it), float16 overflow "
        "(train.precision: float32 to check), or bad input values. Fix the cause and rerun with --fresh."
    )


def sweep_file(runs_dir: str | Path) -> Path:
    """Where `make sweep-batch` writes its result (its default --out under runs_dir)."""
    return Path(runs_dir) / "sweep-batch" / "sweep.json"


def largest_batch_that_fit(path: Path) -> int | None:
    """From the last batch-size sweep on this machine, or None when there is none."""
    try:
        return json.loads(Path(path).read_text()).get("largest_batch_that_fit")
    except (OSError, ValueError, AttributeError):
        return None


def oom_error(batch_size: int, device: str, runs_dir: str | Path) -> UserError:
    path = sweep_file(runs_dir)
    largest_that_fit = largest_batch_that_fit(path)
    if largest_that_fit:
        hint = (
            f"The last batch-size sweep on this machine fit up to {largest_that_fit} per replica "
            f"({path}): rerun with --set pipeline.batch_size={largest_that_fit}."
        )
    else:
        hint = (
            "Run `make sweep-batch` to find the largest batch that fits, or halve it: "
            f"--set pipeline.batch_size={max(1, batch_size // 2)}."
        )
    return UserError(
        f"Out of memory at pipeline.batch_size={batch_size} on {device}. {hint} Mixed precision "
        "(train.precision: auto) also halves activation memory on GPUs."
    )


class StallWatchdog(keras.callbacks.Callback):
    """Ends the process with a clear message when no training step finishes for `timeout_s`.

    A trainer blocked inside TensorFlow waiting for input (every tf.data service worker
    gone, a reader stuck on a dead network file system) cannot be interrupted from Python,
    so a watchdog thread reports and exits instead of letting it hang forever. Checkpoints
    already written stay, so rerunning resumes.
    """

    def __init__(self, timeout_s: float, hint: str):
        super().__init__()
        self.timeout_s = timeout_s
        self.hint = hint
        self._last = None
        self._stop = None

    def _watch(self):
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            if self._last is not None and time.monotonic() - self._last > self.timeout_s:
                print(
                    f"error: no training step finished for {self.timeout_s:g} s. {self.hint} Checkpoints already "
                    "written are kept: rerun the same command to resume.",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(3)

    def _beat(self, *_, logs=None):
        self._last = time.monotonic()

    # Any finished step (training or validation) or a new epoch shows the run is alive.
    on_train_batch_end = on_test_batch_end = on_epoch_begin = _beat

    def on_train_begin(self, logs=None):
        self._beat()
        if self._stop is None:
            self._stop = threading.Event()
            threading.Thread(target=self._watch, name="stall-watchdog", daemon=True).start()

    def stop(self):
        if self._stop is not None:
            self._stop.set()


def stall_timeout(setting, data_service: str | None) -> float:
    if setting == "auto":
        return 300.0 if data_service else 0.0
    return float(setting)
