"""The multi-worker custom loop: MultiWorkerMirroredStrategy across processes and hosts.

Keras 3 `model.fit` fails under MultiWorkerMirroredStrategy (keras-team/keras#20585), so a
multi-worker run uses TensorFlow's own custom-loop API: `distribute_datasets_from_function`
(each worker reads its own shards: file-level sharding) and `strategy.run`. The run is set up
by setup.py exactly like a `fit` run (same model, loss, optimizer, metrics, summary schema);
the chief (worker 0) alone writes the run folder, every worker writes
`workers/<task>.json` with a fingerprint of its final weights, so identical weights can be
checked. Collectives time out after `train.collective_timeout_s` instead of hanging.
Start local workers with `python -m train launch` (launch.py); across hosts, run the same
`python -m train fit ...` on each host with TF_CONFIG set (see README).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from train import models
from train.core import files
from train.core.errors import RunFailed, UserError
from train.measure.throughput import StepTimer
from train.training import checkpoint, guards
from train.training import setup as setup_lib
from train.training.setup import RunSetup


def train(setup: RunSetup, log=print) -> dict:
    cfg, spec, strategy = setup.cfg, setup.spec, setup.strategy
    steps, batch, tag = setup.steps_per_epoch, setup.global_batch, setup.tag
    log(f"{tag} {setup.replicas} replicas in sync, global batch {batch}, precision {setup.choices.precision}")
    model = setup_lib.build_model(cfg, spec, setup.choices, strategy, steps * cfg.train.epochs)
    optimizer = model.optimizer  # a LossScaleOptimizer under mixed_float16, wrapped by compile
    with strategy.scope():
        optimizer.build(model.trainable_variables)
    if cfg.checkpoint.every_steps:
        log(f"{tag} note: the multi-worker loop checkpoints at epoch ends only; checkpoint.every_steps is ignored")
    start_epoch, resume = 0, setup.resume
    if resume and not resume["step_in_epoch"]:
        checkpoint.restore(model, resume["folder"])
        start_epoch = resume["epoch"]
        log(f"{tag} resuming from {resume['folder']} (epoch {start_epoch + 1})")

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # File-level sharding done here, explicitly: each worker reads every N-th shard.
        shards = spec.train_files[context.input_pipeline_id :: context.num_input_pipelines]
        if not shards:
            raise UserError(
                f"{len(spec.train_files)} training shards cannot feed {context.num_input_pipelines} "
                "workers: build the dataset with at least one shard per worker (data.num_shards)."
            )
        dataset = setup.build(
            shards,
            training=True,
            seed=cfg.train.seed + context.input_pipeline_id,
            batch_size=context.get_per_replica_batch_size(batch),
        )
        shard_options = tf.data.Options()
        shard_options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        # Each step takes one batch per replica of this worker: skip that many per finished step.
        local_replicas = max(1, setup.replicas // context.num_input_pipelines)
        return dataset.with_options(shard_options).skip(start_epoch * steps * local_replicas)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    loss_fn = models.loss()
    # Training metrics over this worker's examples (the loss is averaged over every worker's).
    train_metrics = models.metrics()

    @tf.function
    def train_step(iterator):
        def step(images, labels):
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                loss = tf.nn.compute_average_loss(loss_fn.call(labels, logits), global_batch_size=batch)
                scaled = optimizer.scale_loss(loss) if hasattr(optimizer, "scale_loss") else loss
            gradients = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss, labels, logits

        images, labels = next(iterator)
        loss, labels, logits = strategy.run(step, args=(images, labels))
        for metric in train_metrics:
            metric.update_state(
                tf.concat(strategy.experimental_local_results(labels), 0),
                tf.concat(strategy.experimental_local_results(logits), 0),
            )
        return strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)

    writer = files.scalar_writer(setup.run_dir / "train") if setup.task.is_chief else None
    warmup = setup_lib.warmup_steps(cfg.train.warmup_steps, steps, cfg.train.epochs - start_epoch)
    timer = StepTimer(batch, warmup)
    history = dict(resume["history"]) if resume and start_epoch else {}
    saver = None
    if setup.task.is_chief and cfg.checkpoint.enabled:
        saver = checkpoint.Checkpointer(
            setup.run_dir,
            steps,
            cfg.checkpoint.every_epochs,
            0,
            cfg.checkpoint.keep,
            start_global_step=start_epoch * steps,
            history=history,
        )
        saver.set_model(model)
    val_ds = setup.build(spec.val_files, training=False)
    peer_errors = _peer_errors()
    started = time.perf_counter()
    for epoch in range(start_epoch, cfg.train.epochs):
        timer.on_epoch_begin(epoch)
        for metric in train_metrics:
            metric.reset_state()
        losses = []
        for index in range(steps):
            timer.on_train_batch_begin(index)
            try:
                losses.append(float(train_step(iterator)))
            except peer_errors as error:
                raise peer_lost(error, tag, epoch, index, cfg.train.collective_timeout_s, setup.run_dir) from None
            timer.on_train_batch_end(index)
            if not np.isfinite(losses[-1]):
                last = checkpoint.latest(setup.run_dir) if setup.task.is_chief else None
                raise guards.nan_error(
                    {"loss": losses[-1], "global_step": epoch * steps + index + 1, "epoch": epoch},
                    str(last[0]) if last else None,
                    cfg.train.learning_rate,
                )
        logs = {"loss": float(np.mean(losses)), **{m.name: float(m.result()) for m in train_metrics}}
        if setup.task.is_chief:
            logs.update(_evaluate(model, val_ds, loss_fn))
            with writer.as_default(step=epoch):
                for key, value in logs.items():
                    tf.summary.scalar(f"epoch_{key}", value)
            writer.flush()
            if saver is not None:
                saver.step = (epoch + 1) * steps
                saver.on_epoch_end(epoch, logs)
            else:
                for key, value in logs.items():
                    history.setdefault(key, []).append(value)
        log(f"{tag} epoch {epoch + 1}/{cfg.train.epochs}: " + ", ".join(f"{k} {v:.4f}" for k, v in logs.items()))
    wall = time.perf_counter() - started
    history = saver.history if saver is not None else history
    result = setup_lib.summary(setup, model, history, timer.summary(), wall, warmup)
    return setup_lib.finish(setup, model, result, log=log)


def _evaluate(model: keras.Model, dataset: tf.data.Dataset, loss_fn) -> dict:
    """The chief's pass over the whole validation split, with the run's loss and metrics."""
    metrics = models.metrics()
    total, loss_sum = 0, 0.0
    for images, labels in dataset:
        logits = model(images, training=False)
        loss_sum += float(tf.reduce_sum(loss_fn.call(labels, logits)))
        for metric in metrics:
            metric.update_state(labels, logits)
        total += int(labels.shape[0])
    return {"val_loss": loss_sum / total, **{f"val_{m.name}": float(m.result()) for m in metrics}}


def _peer_errors() -> tuple:
    return (
        tf.errors.UnavailableError,
        tf.errors.CancelledError,
        tf.errors.AbortedError,
        tf.errors.DeadlineExceededError,
    )


def peer_lost(error, name: str, epoch: int, index: int, timeout_s: float, run_dir: Path) -> RunFailed:
    """One paragraph for a collective that failed because another worker died or stopped answering."""
    text = str(getattr(error, "message", error))
    peer = re.search(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)", text)
    who = f"{peer.group(1)} {peer.group(2)}" if peer else "another worker"
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith(("Graph execution error", "Detected at node", "File "))
    ]
    cause = re.compile(r"aborted by|connect|connection|deadline|timed? ?out|unavailable", re.I)
    first = next((line for line in lines if cause.search(line)), lines[0] if lines else type(error).__name__)
    last = checkpoint.latest(run_dir)
    where = f"the last checkpoint, {last[0]}" if last else f"the start (no checkpoint in {run_dir} yet)"
    return RunFailed(
        f"{name} lost contact with {who} at epoch {epoch + 1}, step {index + 1} ({type(error).__name__}: "
        f"{first[:200]}). A multi-worker step needs every worker: a worker that died, was stopped or did not "
        f"answer within train.collective_timeout_s ({timeout_s:g} s) ends the run on all of them instead of "
        f"leaving them waiting. Find why {who} stopped (its own output), then restart every worker with the "
        f"same command: they resume from {where}."
    )
