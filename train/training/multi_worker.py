"""The multi-worker custom loop: MultiWorkerMirroredStrategy across processes and hosts.

Keras 3 `model.fit` fails under MultiWorkerMirroredStrategy (keras-team/keras#20585), so a
multi-worker run uses TensorFlow's own custom-loop API: `distribute_datasets_from_function`
(each worker reads its own shards: file-level sharding) and `strategy.run`. The run is set up
by prepare_run.py exactly like a `fit` run (same model, loss, optimizer, metrics, summary schema),
runs the same step (Keras's own `model.train_step`, inside `strategy.run`) and the same end of
an epoch (epoch.py: the validation pass and the epoch's scalars, the chief's), and drives the
same callbacks as `fit` does: the step timer, the profile window (one profile per worker), the
checkpointer (the chief's, `checkpoint.every_steps` included) and the stall watchdog. The
chief (worker 0) alone writes the run folder; every worker writes `workers/<task>.json` with a
fingerprint of its final weights, so identical weights can be checked. Collectives time out
after `train.collective_timeout_s` instead of hanging.

Agreement instead of guessing: every decision that all workers must take together rides on a
collective, so every worker reads the same value and none is left waiting in a collective
that the others have left.
- Where to resume: the chief's newest checkpoint, shared at start-up (another worker's view
  of the shared folder may lag behind, or hold a checkpoint that the chief does not resume).
- When to stop: a SIGTERM (a preemption, `kubectl delete`) or Ctrl-C on any worker is added
  into the next step's all-reduce; every worker stops after that same step, the chief saves a
  checkpoint there, and all exit 143 (130) with one line. A restart resumes from that step.

Start local workers with `python -m train launch` (launch.py); on Kubernetes, TF_CONFIG comes
from the pod's index (cluster.py, deploy/k8s/); elsewhere run `python -m train fit ...` on each
host with TF_CONFIG set (see docs/scaling-out.md).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from step_doctor.callbacks import StepTraceProfiler
from train.core import files
from train.core.errors import RunFailed, Stopped, UserError
from train.measure.monitor import MonitorCallback, Sampler
from train.measure.throughput import StepTimer
from train.training import checkpoint, cluster, guards, plan, prepare_run, run_summary
from train.training.compiled_model import build_model
from train.training.epoch import EpochEnd
from train.training.run_setup import RunSetup

# A stop request's place in the vector every step all-reduces after the loss.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# How long a worker waits for the chief's checkpoint to show on the shared runs folder.
CHECKPOINT_VISIBLE_S = 60.0


def train(setup: RunSetup, log=print) -> dict:
    cfg, strategy = setup.cfg, setup.strategy
    log(
        f"{setup.tag} {setup.replicas} replicas in sync, global batch {setup.global_batch}, "
        f"precision {setup.choices.precision}"
    )
    model = build_model(cfg, setup.spec, setup.choices, strategy, setup.steps_per_epoch * cfg.train.epochs)
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)  # a LossScaleOptimizer under mixed_float16
    loop = _Loop(setup, model, log)
    loop.stopper.install()  # from here a signal is noted and shared with the next step, not fatal
    try:
        return loop.run()
    finally:
        loop.stopper.uninstall()


class _Loop:
    """One worker's part of a multi-worker run: steps, epoch ends, a shared stop."""

    def __init__(self, setup: RunSetup, model: keras.Model, log):
        cfg = setup.cfg
        self.setup, self.model, self.log = setup, model, log
        self.steps, self.epochs = setup.steps_per_epoch, cfg.train.epochs
        self.chief = setup.task.is_chief
        self.stopper = guards.GracefulStop(None, self.steps, self.epochs, grace_s=cluster.STOP_GRACE_S)
        self.history: dict = {}
        self.saver = None
        self.watchdog = None
        self.sampler = Sampler(cfg.monitor.interval_s) if cfg.monitor.enabled else None

    def run(self) -> dict:
        setup, cfg = self.setup, self.setup.cfg
        done = self._resume()
        iterator = iter(setup.strategy.distribute_datasets_from_function(self._dataset_fn(done)))
        train_step = self._train_step()
        callbacks = self._callbacks(done)
        started = time.perf_counter()
        if self.sampler is not None:
            self.sampler.start()
        callbacks.on_train_begin()
        try:
            for epoch in range(done // self.steps, self.epochs):
                callbacks.on_epoch_begin(epoch)
                logs, stop = self._epoch(epoch, done, iterator, train_step, callbacks)
                done = (epoch + 1) * self.steps
                callbacks.on_epoch_end(epoch, logs)  # the chief validates and writes; its checkpoint keeps them
                if self.saver is None:
                    for key, value in logs.items():
                        self.history.setdefault(key, []).append(value)
                if stop and epoch + 1 < self.epochs:
                    raise self._stopped(done, stop)
                self.log(f"{setup.tag} epoch {epoch + 1}/{self.epochs}: " + _format(logs))
        finally:
            callbacks.on_train_end()
            if self.watchdog is not None:
                self.watchdog.stop()
            if self.sampler is not None:
                self.sampler.stop()
        wall = time.perf_counter() - started
        history = self.saver.history if self.saver is not None else self.history
        utilization = self.sampler.summary(since=self.timer.steady_since or 0.0) if self.sampler else None
        result = run_summary.summary(
            setup, self.model, history, self.timer.summary(), wall, self.timer.warmup_steps, utilization
        )
        if self.chief and setup.workload.skips_corrupt(cfg):
            files.write_scalars(setup.run_dir / "train", [("data/skipped_records", len(setup.skipped), 0)], ".data")
        return run_summary.finish(setup, self.model, result, log=self.log)

    def _epoch(self, epoch: int, done: int, iterator, train_step, callbacks) -> tuple[dict, int | None]:
        """The steps of one epoch (from where the run resumed). Returns the epoch's metrics (Keras's, over every
        replica) and the agreed stop signal when every worker is to stop after this epoch's last step, else
        None; raises when they agreed to stop in the middle of it."""
        first = max(0, done - epoch * self.steps)
        self._collective(epoch, first, self.model.reset_metrics)  # its replicated variables: every worker at once
        logs = {}
        for index in range(first, self.steps):
            callbacks.on_train_batch_begin(index)
            requests = tf.constant([1.0 if self.stopper.received == signum else 0.0 for signum in STOP_SIGNALS])
            try:
                shared = self._collective(epoch, index, lambda r=requests: train_step(iterator, r).numpy())
            except tf.errors.ResourceExhaustedError:
                raise guards.oom_error(self.setup.workload, self.setup.cfg, self.setup.found.describe()) from None
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.UnknownError) as error:
                raise prepare_run.data_error(error, self.setup) from None
            metrics, requested = shared[: len(train_step.names)], shared[len(train_step.names) :]
            # Each replica's running means of this epoch, summed by the all-reduce: their mean over every replica
            logs = {name: float(value) / self.setup.replicas for name, value in zip(train_step.names, metrics)}
            callbacks.on_train_batch_end(index, logs)
            if not np.isfinite(logs["loss"]):
                last = checkpoint.latest(self.setup.run_dir) if self.chief else None
                raise guards.nan_error(
                    {"loss": logs["loss"], "global_step": epoch * self.steps + index + 1, "epoch": epoch},
                    str(last[0]) if last else None,
                    self.setup.cfg.train.learning_rate,
                )
            stop = next((signum for signum, count in zip(STOP_SIGNALS, requested) if count > 0), None)
            if stop and index + 1 < self.steps:
                raise self._stopped(epoch * self.steps + index + 1, stop)
            if stop:
                return logs, stop
        return logs, None

    def _collective(self, epoch: int, index: int, call):
        """`call()`, which every worker makes together: a peer that died or stopped answering is one paragraph."""
        try:
            return call()
        except _peer_errors() as error:
            failure = peer_lost(error, self.setup.tag, epoch, index, self.setup)
            if self.setup.workload.data_service(self.setup.cfg):
                _exit_now(failure, 3)
            raise failure from None

    def _stopped(self, done: int, signum: int) -> Stopped:
        """Every worker agreed to stop after step `done`: the chief saves there; one line each."""
        name, own = signal.Signals(signum).name, self.stopper.received == signum
        epoch, step_in_epoch = divmod(done, self.steps)
        where = (
            f"after step {done} (epoch {epoch + 1}, step {step_in_epoch} of {self.steps})"
            if step_in_epoch
            else f"after step {done} (the end of epoch {epoch})"
        )
        origin = "received here" if own else "received by another worker"
        folder = checkpoint.checkpoint_dir(self.setup.run_dir) / f"step-{done:08d}"
        if not self.setup.cfg.checkpoint.enabled:
            saved = "no checkpoint saved (checkpoint.enabled is false): a rerun starts over"
        elif self.chief:
            folder = folder if self.saver.saved_step == done else self.saver.save(done)
            saved = f"checkpoint saved at {folder}: rerun the same command on every worker to resume"
        else:
            saved = f"the chief saves the checkpoint at {folder}: rerun the same command on every worker to resume"
        self.model.stop_training = True
        message = f"{self.setup.tag} stopped by {name} ({origin}) {where}, with every worker; {saved}."
        return Stopped(message, 128 + signum)

    def _resume(self) -> int:
        """The global step every worker resumes from: the chief's, shared by a collective."""
        setup = self.setup
        own = setup.resume["global_step"] if setup.resume else 0
        history = setup.resume.get("history", {}) if setup.resume and self.chief else {}
        try:
            agreed = int(_from_chief(setup.strategy, float(own if self.chief else 0)))
        except _peer_errors() as error:
            raise peer_lost(error, setup.tag, 0, 0, setup) from None
        if not agreed:
            setup.resume = None
            return 0
        folder = checkpoint.checkpoint_dir(setup.run_dir) / f"step-{agreed:08d}"
        deadline = time.monotonic() + CHECKPOINT_VISIBLE_S
        while folder not in checkpoint.list_checkpoints(setup.run_dir):
            if time.monotonic() > deadline:
                raise RunFailed(
                    f"{setup.tag} cannot see the checkpoint {folder} that the chief resumes from (waited "
                    f"{CHECKPOINT_VISIBLE_S:g} s). Every worker must read the same runs folder: put "
                    f"{setup.cfg.runs_dir} on storage they all mount (a ReadWriteMany volume on Kubernetes, NFS "
                    "across hosts)."
                )
            time.sleep(1.0)
        with setup.strategy.scope():
            checkpoint.restore(self.model, folder)
        self.history = dict(history)
        setup.resume = {"folder": str(folder), "global_step": agreed}
        epoch, step = divmod(agreed, self.steps)
        self.log(f"{setup.tag} resuming from {folder} (epoch {epoch + 1}, step {step}); --fresh starts over")
        return agreed

    def _dataset_fn(self, done: int):
        setup, batch = self.setup, self.setup.global_batch

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            # File-level sharding done here, explicitly: each worker reads every N-th shard.
            shards = setup.spec.train_files[context.input_pipeline_id :: context.num_input_pipelines]
            if not shards:
                raise UserError(
                    f"{len(setup.spec.train_files)} training shards cannot feed {context.num_input_pipelines} "
                    "workers: build the dataset with at least one shard per worker (data.num_shards)."
                )
            dataset = setup.build(
                "train",
                files=shards,
                seed=setup.cfg.train.seed + context.input_pipeline_id,
                batch_size=context.get_per_replica_batch_size(batch),
            )
            shard_options = tf.data.Options()
            shard_options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
            # Each step takes one batch per replica of this worker: skip that many per finished step,
            # the batches already trained on, in the same order.
            local_replicas = max(1, setup.replicas // context.num_input_pipelines)
            return dataset.with_options(shard_options).skip(done * local_replicas)

        return dataset_fn

    def _train_step(self):
        """Keras's own step (the one `fit` runs) on each replica. Its metrics and the stop requests ride on one
        all-reduce, so every worker reads the same sums; `train_step.names` names the metrics, in order."""
        model, strategy = self.model, self.setup.strategy
        names: list[str] = []

        @tf.function
        def train_step(iterator, requests):
            def step(batch, requests):
                logs = model.train_step(batch)
                names[:] = list(logs)  # known once traced
                values = [tf.reshape(tf.cast(logs[name], tf.float32), [1]) for name in names]
                return tf.concat([*values, requests], 0)

            shared = strategy.run(step, args=(next(iterator), requests))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, shared, axis=None)

        train_step.names = names
        return train_step

    def _callbacks(self, done: int) -> keras.callbacks.CallbackList:
        """The `fit` loop's callbacks, in its order: profiler before the timer, the epoch's end (the chief's
        validation and scalars, epoch.py) before the checkpointer, the monitor after it, the stall watchdog
        last. Every worker profiles and samples its own host into its own folder (the chief into the run's)."""
        setup, cfg = self.setup, self.setup.cfg
        remaining = self.steps * self.epochs - done
        warmup = plan.warmup_steps(cfg.train.warmup_steps, self.steps, self.epochs - done // self.steps)
        profiler = None
        if cfg.profile.enabled:
            start = plan.profile_window(cfg, remaining, 1, setup.cache_filling(done))
            profiler = StepTraceProfiler(worker_dir(setup), start, cfg.profile.num_steps)
        self.timer = StepTimer(setup.global_batch, warmup, profiler=profiler)
        service = setup.workload.data_service(cfg)
        timeout = guards.stall_timeout(cfg.train.stall_timeout_s, service)
        if timeout:
            where = f"the tf.data service at {service}" if service else "the input"
            self.watchdog = guards.StallWatchdog(
                timeout,
                f"{setup.tag}: {where} stopped delivering batches, or another worker stopped stepping (check that "
                "the data service workers and every training worker run).",
            )
        val_ds = setup.build("validation") if self.chief else None
        ordered = [profiler, self.timer, EpochEnd(setup.run_dir, val_ds, self.watchdog)]
        if self.chief and cfg.checkpoint.enabled:
            self.saver = checkpoint.Checkpointer(
                setup.run_dir,
                self.steps,
                cfg.checkpoint.every_epochs,
                cfg.checkpoint.every_steps,
                cfg.checkpoint.keep,
                start_global_step=done,
                history=self.history,
            )
            ordered.append(self.saver)
        if self.sampler is not None:
            say = lambda message: self.log(f"{setup.tag} {message}")  # noqa: E731
            ordered.append(MonitorCallback(self.sampler, worker_dir(setup) / "system", log=say))
        ordered.append(self.watchdog)
        return keras.callbacks.CallbackList([c for c in ordered if c is not None], model=self.model)


def worker_dir(setup: RunSetup) -> Path:
    """Where this worker's profile and utilization samples go: the chief's in the run folder (so
    `diagnose` and the summary find them), every other worker's under workers/<task>/ (profiles are
    named by host, and local workers share one)."""
    if setup.task.is_chief:
        return setup.run_dir
    return setup.run_dir / "workers" / f"{setup.task.kind}-{setup.task.index}"


def _from_chief(strategy: tf.distribute.Strategy, value: float) -> float:
    """`value` as the chief holds it, on every worker: an all-reduce to which only replica 0 adds."""

    @tf.function
    def share(value):
        def first_replica_only(value):
            first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
            return value * tf.cast(first, value.dtype)

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(first_replica_only, args=(value,)), axis=None)

    return float(share(tf.constant(value, tf.float64)))


def _exit_now(error: Exception, status: int) -> None:
    """Print `error` as the CLI does and end the process at once.

    When a peer is lost while the tf.data service's workers are gone too, a read from the service
    stays blocked inside TensorFlow, and the iterator's teardown waits for it forever (observed: a
    worker that printed this error and never exited). The stall watchdog exits the same way for the
    same reason; checkpoints are written atomically, so nothing is left half-done.
    """
    sys.stdout.flush()
    print(f"error: {error}", file=sys.stderr, flush=True)
    os._exit(status)


def _format(logs: dict) -> str:
    return ", ".join(f"{key} {value:.4f}" for key, value in logs.items())


def _peer_errors() -> tuple:
    return (
        tf.errors.UnavailableError,
        tf.errors.CancelledError,
        tf.errors.AbortedError,
        tf.errors.DeadlineExceededError,
    )


def peer_lost(error, name: str, epoch: int, index: int, setup: RunSetup) -> RunFailed:
    """One paragraph for a collective that failed because another worker died or stopped answering."""
    text = str(getattr(error, "message", error))
    # The peer: the remote target gRPC names, else the first task that is not this one (an op's own device
    # names this task too)
    own = (setup.task.kind, str(setup.task.index))
    tasks = re.findall(r"(remote target )?/job:(\w+)(?:/replica:\d+)?/task:(\d+)", text)
    peers = [(kind, index) for remote, kind, index in tasks if remote] + [
        (kind, index) for _, kind, index in tasks if (kind, index) != own
    ]
    who = " ".join(peers[0]) if peers else "another worker"
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith(("Graph execution error", "Detected at node", "File "))
    ]
    cause = re.compile(r"aborted by|connect|connection|deadline|timed? ?out|unavailable", re.I)
    first = next((line for line in lines if cause.search(line)), lines[0] if lines else type(error).__name__)
    last = checkpoint.latest(setup.run_dir)
    where = f"the last checkpoint, {last[0]}" if last else f"the start (no checkpoint in {setup.run_dir} yet)"
    return RunFailed(
        f"{name} lost contact with {who} at epoch {epoch + 1}, step {index + 1} ({type(error).__name__}: "
        f"{first[:200]}). A multi-worker step needs every worker: a worker that died, was stopped or did not "
        f"answer within train.collective_timeout_s ({setup.cfg.train.collective_timeout_s:g} s) ends the run on all "
        f"of them instead of leaving them waiting. Find why {who} stopped (its own output), then restart every "
        f"worker with the same command: they resume from {where}."
    )
