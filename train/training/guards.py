"""Guard rails: a loss that is no longer a number, a batch that does not fit in memory, a stalled run,
a stop request (SIGTERM, Ctrl-C) that must leave a checkpoint."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

import keras

from step_doctor.callbacks import StepCallback
from train.core import outputs
from train.core.errors import Stopped, UserError
from train.training import plan


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


def largest_batch_that_fit(path: Path, knob: str) -> int | None:
    """From the last batch-size sweep on this machine, when it swept `knob`; None when there is none."""
    from train import workloads

    try:
        result = json.loads(Path(path).read_text())
        swept = result.get("knob") or workloads.of_record(result).batch_knob
        return result.get("largest_batch_that_fit") if swept == knob else None
    except (OSError, ValueError, AttributeError):
        return None


def oom_error(workload, cfg, device: str) -> UserError:
    """Out of memory at the config's batch size: the largest that fit in the last sweep, or half of it."""
    knob, batch_size = workload.batch_knob, workload.batch_size(cfg)
    path = outputs.sweep_result(cfg.runs_dir)
    largest_that_fit = largest_batch_that_fit(path, knob)
    if largest_that_fit:
        hint = (
            f"The last batch-size sweep on this machine fit up to {largest_that_fit} per replica "
            f"({path}): rerun with --set {knob}={largest_that_fit}."
        )
    else:
        hint = (
            f"Run `make sweep-batch{workload.make_args}` to find the largest batch that fits, or halve it: "
            f"--set {knob}={max(1, batch_size // 2)}."
        )
    return UserError(
        f"Out of memory at {knob}={batch_size} on {device}. {hint} Mixed precision "
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


def stall_timeout(setting: float | str, data_service: str | None) -> float:
    """train.stall_timeout_s in seconds (0: no watchdog); a planned config has it decided already."""
    return plan.stall_timeout(data_service)[0] if setting == "auto" else float(setting)


class GracefulStop(StepCallback):
    """On the first SIGTERM or SIGINT: finish the current step, save a checkpoint, stop.

    Preemption, `docker compose stop` and Ctrl-C send a signal; Python's default for SIGTERM
    ends the process at once, losing everything since the last checkpoint. While `fit` runs,
    this callback's handler only notes the signal (Python runs handlers in the main thread,
    between steps); at the next batch end it saves through the Checkpointer and raises
    `Stopped`, which the CLI prints as one line, exiting 143 (SIGTERM) or 130 (SIGINT). The
    same command then resumes. A signal on an epoch's last step lets the validation pass
    finish first, so the checkpoint carries the epoch's metrics; one during the last epoch's
    validation lets the run finish.

    A second signal stops at once. If no step ends within `grace_s` of the signal (a step
    stuck inside TensorFlow, where Python handlers cannot run), a watcher thread that sees
    the signal through `signal.set_wakeup_fd` exits with the same status, keeping the
    checkpoints already written. Keep it below the container's stop grace period.

    It comes after the Checkpointer and TensorBoard in the callback list: they have counted
    the step (and the epoch's metrics) before it saves and stops.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, saver, steps_per_epoch: int, epochs: int, start_step: int = 0, grace_s: float = 20.0):
        super().__init__(start_step)
        self.saver = saver  # a checkpoint.Checkpointer, or None when checkpoints are off
        self.steps_per_epoch = steps_per_epoch
        self.epochs = epochs
        self.grace_s = grace_s
        self.received: int | None = None
        self._previous: dict = {}
        self._wakeup = None  # (read fd, write fd, previous wakeup fd)
        self._done = threading.Event()

    def install(self) -> None:
        """Take over SIGTERM and SIGINT (from the main thread only; elsewhere it does nothing)."""
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._wakeup = (read_fd, write_fd, signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False))
        threading.Thread(target=self._watch, args=(read_fd,), name="stop-watcher", daemon=True).start()

    def uninstall(self) -> None:
        """Give the signals back to their previous handlers."""
        if not self._previous:
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        read_fd, write_fd, previous_fd = self._wakeup
        signal.set_wakeup_fd(previous_fd)
        self._done.set()
        os.close(write_fd)  # the watcher reads end-of-file and ends; it closes the read end

    def _handle(self, signum, frame):
        if self.received is not None:  # the second signal: stop now
            self.uninstall()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        self.received = signum
        _say(
            f"{signal.Signals(signum).name} received: saving a checkpoint after the current step, then stopping "
            "(send it again to stop at once)."
        )

    def _watch(self, read_fd: int) -> None:
        try:
            while True:
                data = os.read(read_fd, 64)
                if not data:
                    return  # uninstalled
                signums = [signum for signum in data if signum in self.SIGNALS]
                if signums:
                    break
            if not self._done.wait(self.grace_s):
                _say(
                    f"error: no training step ended within {self.grace_s:g} s of {signal.Signals(signums[0]).name}; "
                    "exiting without a new checkpoint. Checkpoints already written are kept: rerun the same "
                    "command to resume."
                )
                os._exit(128 + signums[0])
        finally:
            os.close(read_fd)

    def step_end(self, steps, logs):
        if self.received is None or self.model.stop_training:  # stop_training: the NaN guard keeps its checkpoint
            return
        done = self.step + steps
        if done % self.steps_per_epoch:  # mid-epoch; at an epoch's end on_epoch_end stops, after validation
            self._stop(done)

    def on_epoch_end(self, epoch, logs=None):
        if self.received is not None and not self.model.stop_training and epoch + 1 < self.epochs:
            self._stop(self.step)

    def _stop(self, done: int) -> None:
        name = signal.Signals(self.received).name
        epoch, step_in_epoch = divmod(done, self.steps_per_epoch)
        where = (
            f"after step {done} (epoch {epoch + 1}, step {step_in_epoch} of {self.steps_per_epoch})"
            if step_in_epoch
            else f"after step {done} (the end of epoch {epoch})"
        )
        if self.saver is None:
            message = (
                f"stopped by {name} {where}; no checkpoint saved (checkpoint.enabled is false): a rerun starts over."
            )
        else:
            folder = self.saver.root / f"step-{done:08d}" if self.saver.saved_step == done else self.saver.save(done)
            message = f"stopped by {name} {where}; checkpoint saved at {folder}: rerun the same command to resume."
        self.model.stop_training = True
        raise Stopped(message, 128 + self.received)


def _say(message: str) -> None:
    """One line on stderr, written without Python's buffered streams (safe inside a signal handler)."""
    os.write(2, (message + "\n").encode())
