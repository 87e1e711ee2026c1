"""Checkpoints that survive `kill -9`, and resuming from them.

A checkpoint is a folder `runs/<name>/checkpoints/step-<global step>/` holding the model
and optimizer state (`state.weights.h5`) and where training stood (`state.json`: epoch,
step within the epoch, global step, the metrics of finished epochs). It is written into a
`.tmp` folder first and renamed into place when complete: a rename is atomic, so a
checkpoint folder either exists whole or not at all, and a crash while writing leaves
only a `.tmp` folder, which the next run deletes. The newest `keep` checkpoints stay.

Resuming rebuilds the same pipeline and skips the batches already trained on; with
`train.deterministic: true` (op determinism, seeded pipelines, stateless augmentation)
the resumed run ends with exactly the weights of an uninterrupted one on one device. Under
MirroredStrategy it continues from the saved step but not bit for bit: Keras's `fit` opens a
throwaway iterator first, and each new iterator draws the next reshuffled order.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import keras

from step_doctor.callbacks import StepCallback

STATE = "state.json"
WEIGHTS = "state.weights.h5"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _complete(folder: Path) -> bool:
    return (
        folder.is_dir()
        and not folder.name.endswith(".tmp")
        and (folder / STATE).is_file()
        and (folder / WEIGHTS).is_file()
    )


def _step_of(folder: Path) -> int:
    return int(folder.name.split("-", 1)[1])


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith("step-") and _complete(p)]
    return sorted(found, key=_step_of)


def remove_partial(run_dir: Path) -> None:
    """Delete checkpoint folders a crash left half-written."""
    root = checkpoint_dir(run_dir)
    if root.is_dir():
        for folder in root.iterdir():
            if folder.name.endswith(".tmp"):
                shutil.rmtree(folder, ignore_errors=True)


def latest(run_dir: Path) -> tuple[Path, dict] | None:
    """The newest complete checkpoint and its state, or None."""
    for folder in reversed(list_checkpoints(run_dir)):
        try:
            return folder, json.loads((folder / STATE).read_text())
        except (OSError, ValueError):
            continue  # unreadable: fall back to the one before
    return None


def restore(model: keras.Model, folder: str | Path) -> None:
    folder = Path(folder)
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    model.load_weights(folder / WEIGHTS)


class Checkpointer(StepCallback):
    """Saves every `every_epochs` epochs and, when `every_steps` > 0, every that many steps.

    It must come after the NaN guard in the callback list (fit_loop.Callbacks orders them):
    the guard marks the model with `stop_training`, nothing is saved from then on, and the last
    checkpoint stays good.
    """

    def __init__(
        self,
        run_dir: Path,
        steps_per_epoch: int,
        every_epochs: int,
        every_steps: int,
        keep: int,
        start_global_step: int = 0,
        history: dict | None = None,
    ):
        super().__init__(start_global_step)
        self.root = checkpoint_dir(run_dir)
        self.steps_per_epoch = steps_per_epoch
        self.every_epochs = every_epochs
        self.every_steps = every_steps
        self.keep = keep
        self.history = {k: list(v) for k, v in (history or {}).items()}
        self.saved_step: int | None = None  # the global step of the last checkpoint this run saved
        self._since_save = 0

    def step_end(self, steps, logs):
        self._since_save += steps
        if self.model.stop_training:
            return
        done = self.step + steps
        if self.every_steps and self._since_save >= self.every_steps and done % self.steps_per_epoch:
            self.save(done)

    def on_epoch_end(self, epoch, logs=None):
        if self.model.stop_training:
            return
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(float(value))
        if (self.step // self.steps_per_epoch) % self.every_epochs == 0:
            self.save(self.step)

    def save(self, global_step: int) -> Path:
        """A checkpoint of the model after `global_step` steps."""
        epoch, step_in_epoch = divmod(global_step, self.steps_per_epoch)
        final = self.root / f"step-{global_step:08d}"
        tmp = self.root / f"step-{global_step:08d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.model.save_weights(tmp / WEIGHTS)
        state = {"epoch": epoch, "step_in_epoch": step_in_epoch, "global_step": global_step, "history": self.history}
        (tmp / STATE).write_text(json.dumps(state, indent=1))
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        self._since_save = 0
        self.saved_step = global_step
        for old in list_checkpoints(self.root.parent)[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final


def _fsync_tree(folder: Path) -> None:
    """Flush the files to disk before the rename publishes them."""
    for path in folder.iterdir():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())


def plan_segments(epochs: int, steps_per_epoch: int, epoch: int, step_in_epoch: int) -> list[tuple[int, int, int]]:
    """`model.fit` calls that finish the run from (epoch, step_in_epoch).

    Each item is (initial_epoch, epochs, steps_per_epoch). Keras starts epochs at step 0, so
    a resume from the middle of an epoch first finishes that epoch as a shorter one.
    """
    segments = []
    if step_in_epoch:
        segments.append((epoch, epoch + 1, steps_per_epoch - step_in_epoch))
        epoch += 1
    if epoch < epochs:
        segments.append((epoch, epochs, steps_per_epoch))
    return segments
