"""The Keras `fit` loop: one run set up by prepare_run.py, trained with `model.fit` and callbacks.

Multi-worker runs go to multi_worker.py instead (Keras 3 `fit` fails under
MultiWorkerMirroredStrategy: keras-team/keras#20585); both share the set-up and the summary.
"""

from __future__ import annotations

import sys
import time

import tensorflow as tf

from step_doctor.callbacks import StepTraceProfiler
from train.config import Config
from train.core import files
from train.core.errors import Stopped
from train.measure.monitor import MonitorCallback, Sampler
from train.measure.throughput import StepTimer
from train.training import checkpoint, compiled_model, epoch, guards, plan, prepare_run, run_summary
from train.training.run_setup import RunSetup


def run(
    cfg: Config, config_path: str | None = None, build_hint: str = "make data", log=print, fresh: bool = False
) -> dict:
    """Train `cfg` and return its summary (also written to runs/<name>/summary.json)."""
    setup = prepare_run.prepare(cfg, config_path=config_path, build_hint=build_hint, fresh=fresh, log=log)
    if setup.cfg.train.strategy == "multi_worker":
        from train.training import multi_worker

        return multi_worker.train(setup, log=log)
    return train(setup, log=log)


class Callbacks:
    """The callbacks of a `fit` run, in the order their cooperation needs.

    NaN guard before the checkpointer (the guard sets stop_training, the checkpointer then
    saves nothing more); profiler before the timer (starting and stopping the profiler stays
    outside the timed steps); the epoch's end (validation into the epoch's logs, its scalars:
    epoch.py, shared with the multi-worker loop) before the checkpointer, which saves those logs;
    the signal stop after the checkpointer and the epoch's end (they have counted the step and the
    epoch's metrics when it saves through the checkpointer and ends the run); the stall watchdog last.
    """

    def __init__(self, setup: RunSetup, done_steps: int, history: dict, log, val_ds):
        cfg = setup.cfg
        steps, epochs = setup.steps_per_epoch, cfg.train.epochs
        self.warmup = plan.warmup_steps(cfg.train.warmup_steps, steps, epochs - done_steps // steps)
        self.guard = guards.NanGuard(done_steps)
        # what the workload measures beside step time (text: real tokens, padding, shapes, compiles); None: a step
        # consumes the global batch of examples, and examples/s is counted from it
        self.profiler = None
        if cfg.profile.enabled:
            filling = setup.cache_filling(done_steps)
            start = plan.profile_window(cfg, steps * epochs - done_steps, setup.choices.steps_per_execution, filling)
            self.profiler = StepTraceProfiler(setup.run_dir, start, cfg.profile.num_steps)
        self.meter = setup.workload.meter(
            self.warmup,
            setup.run_dir / "train",
            setup.choices.jit_compile,
            setup.run_dir,
            setup.task.is_chief,
            profiler=self.profiler,
        )
        self.timer = StepTimer(
            setup.global_batch,
            self.warmup,
            setup.run_dir / "train",
            fixed_batch=self.meter is None,
            profiler=self.profiler,
        )
        self.saver = None
        if cfg.checkpoint.enabled:
            self.saver = checkpoint.Checkpointer(
                setup.run_dir,
                steps,
                cfg.checkpoint.every_epochs,
                cfg.checkpoint.every_steps,
                cfg.checkpoint.keep,
                start_global_step=done_steps,
                history=history,
            )
        self.sampler = Sampler(cfg.monitor.interval_s) if cfg.monitor.enabled else None
        self.monitor = (
            MonitorCallback(self.sampler, setup.run_dir / "system", log=lambda m: log(f"{setup.tag} {m}"))
            if self.sampler
            else None
        )
        self.watchdog = None
        service = setup.workload.data_service(cfg)
        timeout = guards.stall_timeout(cfg.train.stall_timeout_s, service)
        if timeout:
            self.watchdog = guards.StallWatchdog(
                timeout,
                (
                    f"The tf.data service at {service} may have lost its workers (check that they run)."
                    if service
                    else "The input pipeline stopped delivering batches."
                ),
            )
        self.epoch_end = epoch.EpochEnd(setup.run_dir, val_ds, self.watchdog)
        self.stopper = guards.GracefulStop(self.saver, steps, epochs, start_step=done_steps)
        ordered = [
            self.guard,
            self.profiler,
            self.timer,
            self.meter and self.meter.callback,
            self.epoch_end,
            self.saver,
            self.monitor,
            self.stopper,
            self.watchdog,
        ]
        self.all = [callback for callback in ordered if callback is not None]

    def start(self):
        self.stopper.install()
        if self.sampler is not None:
            self.sampler.start()

    def stop(self):
        self.stopper.uninstall()
        if self.sampler is not None:
            self.sampler.stop()
        if self.watchdog is not None:
            self.watchdog.stop()

    def stopped(self):
        """After a stop request ended `fit` early: close the profile window and flush the event files."""
        for callback in (self.profiler, self.monitor, self.epoch_end, self.meter and self.meter.callback):
            if callback is not None:
                callback.on_train_end()


def train(setup: RunSetup, log=print) -> dict:
    cfg, spec = setup.cfg, setup.spec
    total_steps = setup.steps_per_epoch * cfg.train.epochs
    model = compiled_model.build_model(cfg, spec, setup.choices, setup.strategy, total_steps)
    if cfg.profile.enabled and setup.choices.steps_per_execution > 1:
        log(
            f"{setup.tag} note: with steps_per_execution={setup.choices.steps_per_execution} xprof finds no step "
            "markers inside multi-step executions: its step-time analysis will be n/a; the run summary and "
            "`diagnose` infer the steps from the executions (figures per execution)."
        )
    steps = setup.steps_per_epoch
    start_epoch, start_step, history = 0, 0, {}
    if setup.resume:
        with setup.strategy.scope():
            checkpoint.restore(model, setup.resume["folder"])
        start_epoch, start_step = setup.resume["epoch"], setup.resume["step_in_epoch"]
        history = setup.resume["history"]
        log(
            f"{setup.tag} resuming from {setup.resume['folder']} (epoch {start_epoch + 1}, step {start_step}); "
            "--fresh starts over"
        )
    done_steps = start_epoch * steps + start_step
    callbacks = Callbacks(setup, done_steps, history, log, setup.build("validation"))
    started = time.perf_counter()
    try:
        callbacks.start()
        for initial_epoch, epochs, segment_steps in checkpoint.plan_segments(
            cfg.train.epochs, steps, start_epoch, start_step
        ):
            train_ds = setup.build("train")
            if done_steps:
                train_ds = train_ds.skip(done_steps)  # the batches already trained on, in the same order
            if callbacks.meter is not None:
                train_ds = callbacks.meter.wrap(train_ds)
            segment = model.fit(
                train_ds,
                initial_epoch=initial_epoch,
                epochs=epochs,
                steps_per_epoch=segment_steps,
                shuffle=False,  # the dataset shuffles itself
                callbacks=callbacks.all,  # validation included: epoch.EpochEnd, as in the multi-worker loop
                verbose=1 if sys.stdout.isatty() else 2,
            )
            for key, values in segment.history.items():
                history.setdefault(key, []).extend(float(v) for v in values)
            done_steps += (epochs - initial_epoch) * segment_steps
            if callbacks.guard.tripped:
                break
    except Stopped:
        callbacks.stopped()
        raise
    except tf.errors.ResourceExhaustedError:
        raise guards.oom_error(setup.workload, cfg, setup.found.describe()) from None
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.UnknownError) as error:
        raise prepare_run.data_error(error, setup) from None
    finally:
        callbacks.stop()
    if callbacks.guard.tripped:
        last = checkpoint.latest(setup.run_dir)
        raise guards.nan_error(callbacks.guard.tripped, str(last[0]) if last else None, cfg.train.learning_rate)
    wall = time.perf_counter() - started

    utilization = None
    if callbacks.sampler is not None:
        utilization = callbacks.sampler.summary(since=callbacks.timer.steady_since or 0.0)
    timing, figures = callbacks.timer.summary(), None
    if callbacks.meter is not None:
        figures, rate = callbacks.meter.finish()
        if rate:  # a batch of the workload's holds a varying number of examples: the ones consumed
            timing["examples_per_sec"] = rate
    result = run_summary.summary(setup, model, history, timing, wall, callbacks.warmup, utilization, figures)
    if setup.workload.skips_corrupt(cfg):
        files.write_scalars(setup.run_dir / "train", [("data/skipped_records", len(setup.skipped), 0)], ".data")
    return run_summary.finish(setup, model, result, log=log)
