"""Training across processes and hosts: MultiWorkerMirroredStrategy, and a local launcher.

Keras 3 `model.fit` fails under MultiWorkerMirroredStrategy (keras-team/keras#20585), so a
multi-worker run uses TensorFlow's own custom-loop API: `distribute_datasets_from_function`
(each worker reads its own shards: file-level sharding) and `strategy.run`. Every worker
runs the same command with its own TF_CONFIG; the chief (worker 0) alone writes the run
folder (config, TensorBoard events, checkpoints, model, summary.json); every worker writes
`workers/<task>.json` with a fingerprint of its final weights, so identical weights can be
checked. Collectives time out after `train.collective_timeout_s` instead of hanging.

    python -m train launch --workers 2 -- fit --config configs/optimized.yaml

starts N workers on this machine with TF_CONFIG on free localhost ports; across hosts, run
the same `python -m train fit ...` on each host with TF_CONFIG set (see README).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from train.errors import RunFailed, UserError


def _weights_fingerprint(model) -> str:
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def run(cfg, spec, found, choices, config_path=None, build_hint="make data", log=print, fresh=False) -> dict:
    import keras
    import tensorflow as tf

    from train import checkpoint, fit, integrity, pipeline
    from train import config as config_lib
    from train.throughput import StepTimer

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    task_type, task_id = resolver.task_type or "worker", resolver.task_id or 0
    is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0
                                         and "chief" not in resolver.cluster_spec().as_dict())
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=cfg.train.collective_timeout_s)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    replicas = strategy.num_replicas_in_sync
    batch = fit.global_batch_size(cfg, strategy)
    fit.check_batch_size(cfg, spec, replicas)
    if cfg.data.verify:
        problems = integrity.verify(spec)
        if problems:
            raise fit._damaged(spec, problems, build_hint)
    name = f"[{cfg.name} {task_type} {task_id}]"
    run_dir = cfg.run_dir
    resume = None
    if is_chief:
        run_dir, resume = fit._prepare_run_dir(cfg, fresh)
        config_lib.save(cfg, run_dir / "config.yaml", f"Resolved config of multi-worker run '{cfg.name}'.")
    else:
        found_checkpoint = None if fresh else checkpoint.latest(run_dir)
        resume = {"folder": str(found_checkpoint[0]), **found_checkpoint[1]} if found_checkpoint else None
    log(f"{name} {replicas} replicas in sync, global batch {batch}, precision {choices.precision}")

    knobs = cfg.pipeline
    steps = cfg.train.steps_per_epoch or pipeline.steps_per_epoch(spec.num_train, batch, knobs.drop_remainder)
    keras.utils.set_random_seed(cfg.train.seed)
    # The same compiled model as a single-process run: its optimizer (a LossScaleOptimizer under
    # mixed_float16, wrapped by compile) is what the custom loop steps and checkpoints save.
    model = fit.build_model(cfg, spec, choices, steps * cfg.train.epochs, strategy)
    optimizer = model.optimizer
    with strategy.scope():
        optimizer.build(model.trainable_variables)
    start_epoch = 0
    if resume and not resume["step_in_epoch"]:
        checkpoint.restore(model, Path(resume["folder"]))
        start_epoch = resume["epoch"]
        log(f"{name} resuming from {resume['folder']} (epoch {start_epoch + 1})")

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # File-level sharding done here, explicitly: each worker reads every N-th shard.
        files = spec.train_files[context.input_pipeline_id::context.num_input_pipelines]
        if not files:
            raise UserError(f"{len(spec.train_files)} training shards cannot feed {context.num_input_pipelines} "
                            "workers: build the dataset with at least one shard per worker (data.num_shards).")
        dataset = pipeline.build(files, spec, knobs, training=True, num_examples=spec.num_train,
                                 seed=cfg.train.seed + context.input_pipeline_id,
                                 batch_size=context.get_per_replica_batch_size(batch))
        shard_options = tf.data.Options()
        shard_options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return dataset.with_options(shard_options).skip(start_epoch * steps)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(iterator):
        def step(images, labels):
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                per_example = loss_fn(labels, logits)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
                scaled = optimizer.scale_loss(loss) if hasattr(optimizer, "scale_loss") else loss
            gradients = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), labels), tf.float32))
            return loss, correct

        images, labels = next(iterator)
        loss, correct = strategy.run(step, args=(images, labels))
        return (strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None),
                strategy.reduce(tf.distribute.ReduceOp.SUM, correct, axis=None))

    writer = tf.summary.create_file_writer(str(run_dir / "train")) if is_chief else None
    timer = StepTimer(batch, fit.warmup_steps(cfg.train.warmup_steps, steps, cfg.train.epochs - start_epoch))
    saver = None
    history = dict(resume["history"]) if resume and start_epoch else {}
    if is_chief and cfg.checkpoint.enabled:
        saver = checkpoint.Checkpointer(run_dir, steps, cfg.checkpoint.every_epochs, 0, cfg.checkpoint.keep,
                                        start_global_step=start_epoch * steps, history=history)
        saver.set_model(model)
    val_ds = pipeline.build(spec.val_files, spec, knobs, training=False, num_examples=spec.num_val,
                            seed=cfg.train.seed, batch_size=cfg.pipeline.batch_size)
    peer_errors = _peer_errors()
    started = time.perf_counter()
    for epoch in range(start_epoch, cfg.train.epochs):
        timer.on_epoch_begin(epoch)
        losses, corrects = [], []
        for index in range(steps):
            timer.on_train_batch_begin(index)
            try:
                loss, correct = train_step(iterator)
            except peer_errors as error:
                raise peer_lost(error, name, epoch, index, cfg.train.collective_timeout_s, run_dir) from None
            losses.append(float(loss))
            corrects.append(float(correct))
            timer.on_train_batch_end(index)
            if not np.isfinite(losses[-1]):
                from train import guards

                last = checkpoint.latest(run_dir) if is_chief else None
                raise guards.nan_error({"loss": losses[-1], "global_step": epoch * steps + index + 1,
                                        "epoch": epoch}, str(last[0]) if last else None, cfg.train.learning_rate)
        logs = {"loss": float(np.mean(losses)), "accuracy": float(np.sum(corrects) / (steps * batch))}
        if is_chief:
            logs.update(_evaluate(model, val_ds, loss_fn))
            with writer.as_default(step=epoch):
                for key, value in logs.items():
                    tf.summary.scalar(f"epoch_{key}", value)
            writer.flush()
            if saver is not None:
                saver.global_step = (epoch + 1) * steps
                saver.on_epoch_end(epoch, logs)
            else:
                for key, value in logs.items():
                    history.setdefault(key, []).append(value)
        log(f"{name} epoch {epoch + 1}/{cfg.train.epochs}: " + ", ".join(f"{k} {v:.4f}" for k, v in logs.items()))
    wall = time.perf_counter() - started

    fingerprint = _weights_fingerprint(model)
    workers_dir = run_dir / "workers"
    workers_dir.mkdir(parents=True, exist_ok=True)
    fit.write_json(workers_dir / f"{task_type}-{task_id}.json",
                   {"task": f"{task_type}:{task_id}", "weights_sha256": fingerprint, "epochs": cfg.train.epochs,
                    "steps_per_epoch": steps, "final_loss": logs["loss"]})
    if not is_chief:
        return {"task": f"{task_type}:{task_id}", "weights_sha256": fingerprint}
    history = saver.history if saver is not None else history
    summary = {
        "name": cfg.name, "run_dir": str(run_dir), "config": config_path, "device": found.describe(),
        "device_kind": found.kind, "strategy": "multi_worker", "workers": resolver.cluster_spec().num_tasks("worker"),
        "replicas": replicas, "batch_size": cfg.pipeline.batch_size, "global_batch_size": batch,
        "model": cfg.model.name, "pipeline": pipeline.describe(knobs, spec, spec.num_train),
        "epochs": cfg.train.epochs, "steps_per_epoch": steps, **timer.summary(),
        "final_loss": history.get("loss", [None])[-1], "final_accuracy": history.get("accuracy", [None])[-1],
        "val_loss": history.get("val_loss", [None])[-1], "val_accuracy": history.get("val_accuracy", [None])[-1],
        "history": history, "wall_time_s": wall, "weights_sha256": fingerprint,
        "input_bound_percent": None, "device_busy_percent": None,
    }
    fit.save_model(model, run_dir / "model.keras")
    fit.write_json(run_dir / "summary.json", summary)
    log(f"{name} done: {summary['examples_per_sec'] or 0:.0f} examples/s across {replicas} replicas, "
        f"val_accuracy {summary['val_accuracy']:.3f} -> {run_dir}/summary.json")
    return summary


def _peer_errors() -> tuple:
    import tensorflow as tf

    return (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError,
            tf.errors.DeadlineExceededError)


def peer_lost(error, name: str, epoch: int, index: int, timeout_s: float, run_dir: Path) -> RunFailed:
    """One paragraph for a collective that failed because another worker died or stopped answering."""
    from train import checkpoint

    text = str(getattr(error, "message", error))
    peer = re.search(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)", text)
    who = f"{peer.group(1)} {peer.group(2)}" if peer else "another worker"
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.strip().startswith(("Graph execution error", "Detected at node", "File "))]
    cause = re.compile(r"aborted by|connect|connection|deadline|timed? ?out|unavailable", re.I)
    first = next((line for line in lines if cause.search(line)), lines[0] if lines else type(error).__name__)
    last = checkpoint.latest(run_dir)
    where = f"the last checkpoint, {last[0]}" if last else f"the start (no checkpoint in {run_dir} yet)"
    return RunFailed(
        f"{name} lost contact with {who} at epoch {epoch + 1}, step {index + 1} ({type(error).__name__}: "
        f"{first[:200]}). A multi-worker step needs every worker: a worker that died, was stopped or did not "
        f"answer within train.collective_timeout_s ({timeout_s:g} s) ends the run on all of them instead of "
        f"leaving them waiting. Find why {who} stopped (its own output), then restart every worker with the "
        f"same command: they resume from {where}.")


def _evaluate(model, dataset, loss_fn) -> dict:
    import tensorflow as tf

    total, loss_sum, correct = 0, 0.0, 0.0
    for images, labels in dataset:
        logits = model(images, training=False)
        loss_sum += float(tf.reduce_sum(loss_fn(labels, logits)))
        correct += float(tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), labels), tf.float32)))
        total += int(labels.shape[0])
    return {"val_loss": loss_sum / total, "val_accuracy": correct / total}


# ---------------------------------------------------------------------------------------------

def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def launch(workers: int, command: list[str], grace_s: float = 10.0) -> int:
    """Run `python -m train <command>` as `workers` local processes of one multi-worker cluster.

    Output is prefixed with the worker. When a worker fails, the others are stopped (they
    would wait for it in a collective) and the exit status says which one failed.
    """
    if workers < 1:
        raise UserError("--workers must be at least 1.")
    if not command:
        raise UserError("Give the command the workers run after --, e.g. "
                        "python -m train launch --workers 2 -- fit --config configs/optimized.yaml")
    ports = free_ports(workers)
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    processes = []
    for index in range(workers):
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
        process = subprocess.Popen([sys.executable, "-m", "train", *command], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, bufsize=1)
        threading.Thread(target=_relay, args=(process, f"[worker {index}] "), daemon=True).start()
        processes.append(process)
    print(f"launched {workers} workers: {', '.join(cluster['worker'])}", flush=True)
    failed = None
    try:
        while True:
            codes = [process.poll() for process in processes]
            failed = next(((i, c) for i, c in enumerate(codes) if c not in (None, 0)), None)
            if failed or all(code == 0 for code in codes):
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        failed = (-1, 130)
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    if failed:
        index, code = failed
        who = "interrupted" if index < 0 else f"worker {index} exited with status {code}"
        print(f"error: {who}; the other workers were stopped (they would wait for it forever). Its output is above; "
              "checkpoints written so far are kept, so rerunning the same command resumes.", file=sys.stderr,
              flush=True)
        return 3
    print(f"all {workers} workers finished", flush=True)
    return 0


def _relay(process: subprocess.Popen, prefix: str) -> None:
    for line in process.stdout:
        sys.stdout.write(prefix + line)
        sys.stdout.flush()
