"""The end of an epoch and the validation pass, one definition for both loops.

The step is Keras's own `model.train_step` (the compiled loss, optimizer and metrics of
compiled_model.py): `model.fit` runs it, and the multi-worker loop runs it inside `strategy.run`
(multi_worker.py). The epoch's end is `EpochEnd`, a callback both loops run before the checkpointer:
the validation pass below, its figures added to the epoch's logs (so the checkpointer, the history and
the progress line see them), and the epoch's TensorBoard scalars, named as Keras's TensorBoard callback
names them (train/epoch_loss, validation/epoch_loss, ...).
"""

from __future__ import annotations

from pathlib import Path

import keras
import tensorflow as tf

from train import models


def evaluate(model: keras.Model, dataset: tf.data.Dataset, watchdog=None) -> dict:
    """One pass over the validation split with the run's loss and metrics (train/models.py): val_loss, val_<metric>."""
    loss_fn, metrics = models.loss(), models.metrics()

    @tf.function(reduce_retracing=True)  # text batches come in several shapes (buckets, last partial batches)
    def logits_and_loss(inputs, labels, weights):
        logits = model(inputs, training=False)
        # A model of the forker's may end in bfloat16/float16 logits under mixed precision: sum the loss in float32.
        losses = tf.cast(loss_fn.call(labels, logits), tf.float32)
        return logits, tf.reduce_sum(losses * weights), tf.reduce_sum(weights)

    total, loss_sum = 0.0, 0.0
    for index, batch in enumerate(dataset):
        # (inputs, labels), or packed text rows: (inputs, labels, weights), a weight per segment slot
        inputs, labels = batch[0], batch[1]
        weights = batch[2] if len(batch) == 3 else tf.ones(tf.shape(labels), tf.float32)
        logits, loss, count = logits_and_loss(inputs, labels, weights)
        loss_sum += float(loss)
        for metric in metrics:
            metric.update_state(labels, logits, sample_weight=weights if len(batch) == 3 else None)
        total += float(count)
        if watchdog is not None:
            watchdog.on_test_batch_end(index)
    return {"val_loss": loss_sum / total, **{f"val_{m.name}": float(m.result()) for m in metrics}}


class EpochEnd(keras.callbacks.Callback):
    """At each epoch's end: validate into the epoch's logs, then write the epoch's scalars. The multi-worker
    loop gives it to the chief only (`dataset` None elsewhere: nothing validated, nothing written)."""

    def __init__(self, run_dir: Path, dataset: tf.data.Dataset | None, watchdog=None):
        super().__init__()
        self.run_dir, self.dataset, self.watchdog = Path(run_dir), dataset, watchdog
        self._writers: dict[str, tf.summary.SummaryWriter] = {}

    def on_epoch_end(self, epoch, logs=None):
        if self.dataset is None or logs is None:
            return
        logs.update(evaluate(self.model, self.dataset, self.watchdog))
        for split, prefix in (("train", ""), ("validation", "val_")):
            values = {k.removeprefix(prefix): v for k, v in logs.items() if k.startswith("val_") == bool(prefix)}
            writer = self._writer(split)
            with writer.as_default(step=epoch):
                for key, value in values.items():
                    tf.summary.scalar(f"epoch_{key}", value)
            writer.flush()

    def on_train_end(self, logs=None):
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def _writer(self, split: str) -> tf.summary.SummaryWriter:
        if split not in self._writers:
            self._writers[split] = tf.summary.create_file_writer(str(self.run_dir / split))
        return self._writers[split]
