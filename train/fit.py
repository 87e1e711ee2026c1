"""One training run: config -> device choices -> pipeline -> model -> `model.fit` -> run folder.

The run folder (runs/<name>/) is the interface to everything that analyses a run:
    config.yaml        the resolved config (every `auto` replaced by the choice made here)
    train/, validation/  TensorBoard events: loss, accuracy, examples/s, step time
    system/            TensorBoard events: CPU and GPU utilization samples
    plugins/profile/   the TensorBoard profile of a steady-state window, with step markers
    checkpoints/       the newest checkpoints, to resume an unfinished run (see train/checkpoint.py)
    model.keras        the trained model
    summary.json       the figures: examples/s, step time, accuracy, utilization, device
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import keras
import tensorflow as tf

from train import checkpoint, datasets, devices, guards, integrity, models, pipeline
from train import config as config_lib
from train.config import Config
from train.errors import UserError
from train.guards import NanGuard
from train.monitor import MonitorCallback, Sampler
from train.profiling import StepTraceProfiler
from train.throughput import StepTimer

RUN_OUTPUTS = ("config.yaml", "summary.json", "model.keras", "train", "validation", "system", "plugins",
               "checkpoints")


def write_json(path: Path, payload: dict) -> None:
    """Write JSON atomically: readers never see a half-written file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    tmp.replace(path)


def resolved_config(cfg: Config, choices: devices.Choices) -> Config:
    if cfg.train.deterministic and not cfg.pipeline.deterministic:
        cfg = dataclasses.replace(cfg, pipeline=dataclasses.replace(cfg.pipeline, deterministic=True))
    train = dataclasses.replace(
        cfg.train,
        precision=choices.precision,
        jit_compile=choices.jit_compile,
        steps_per_execution=choices.steps_per_execution,
        strategy=choices.strategy,
    )
    return dataclasses.replace(cfg, train=train)


def make_strategy(name: str, cpu_replicas: int = 1) -> tf.distribute.Strategy:
    """The tf.distribute strategy for `train.strategy` (multi_worker runs in train/distributed.py)."""
    if name == "mirrored":
        if not tf.config.list_physical_devices("GPU") and cpu_replicas > 1:
            cpu = tf.config.list_physical_devices("CPU")[0]
            try:
                tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * cpu_replicas)
            except RuntimeError:
                pass  # already configured in this process (the first run set it)
            return tf.distribute.MirroredStrategy([f"/cpu:{index}" for index in range(cpu_replicas)])
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def global_batch_size(cfg: Config, strategy: tf.distribute.Strategy) -> int:
    return cfg.pipeline.batch_size * strategy.num_replicas_in_sync


def check_batch_size(cfg: Config, spec: datasets.DatasetSpec, replicas: int = 1) -> None:
    knobs = cfg.pipeline
    if knobs.drop_remainder and knobs.batch_size * replicas > spec.num_train:
        raise UserError(
            f"pipeline.batch_size ({knobs.batch_size}"
            + (f" per replica, {knobs.batch_size * replicas} over {replicas} replicas" if replicas > 1 else "")
            + f") is larger than the training split of {spec.root} ({spec.num_train} examples), so drop_remainder "
            "would leave no batch at all. Lower pipeline.batch_size or set pipeline.drop_remainder=false."
        )


def learning_rate(cfg: Config, replicas: int, total_steps: int | None = None):
    """The peak rate (times the replicas under the linear scaling rule), decaying along a cosine to 1 %
    over `total_steps`, so the last epochs settle instead of jumping around the minimum."""
    peak = cfg.train.learning_rate * (replicas if cfg.train.scale_learning_rate else 1)
    if total_steps:
        return keras.optimizers.schedules.CosineDecay(peak, decay_steps=total_steps, alpha=0.01)
    return peak


def build_model(cfg: Config, spec: datasets.DatasetSpec, choices: devices.Choices,
                total_steps: int | None = None, strategy: tf.distribute.Strategy | None = None) -> keras.Model:
    """The compiled model of `cfg`, under its precision policy and distribution strategy."""
    keras.mixed_precision.set_global_policy(choices.precision)
    strategy = strategy or tf.distribute.get_strategy()
    initial = None
    if strategy.num_replicas_in_sync > 1:
        # Initialized outside the strategy, so that the same seed gives the same starting
        # weights with or without distribution (strategies draw initial values differently).
        initial = models.build_model(cfg.model.name, spec.image_shape, spec.num_classes, cfg.model.params)
    with strategy.scope():
        model = models.build_model(cfg.model.name, spec.image_shape, spec.num_classes, cfg.model.params)
        if initial is not None:
            model.set_weights(initial.get_weights())
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate(cfg, strategy.num_replicas_in_sync, total_steps)),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=choices.jit_compile,
            steps_per_execution=choices.steps_per_execution,
        )
    return model


def warmup_steps(setting: int | str, steps_per_epoch: int, epochs: int) -> int:
    if setting != "auto":
        return int(setting)
    return steps_per_epoch if epochs >= 2 else min(20, steps_per_epoch // 4)


def _profile_window(cfg: Config, total_steps: int, steps_per_execution: int) -> int:
    """The first profiled step, moved earlier when the run is too short to reach the window."""
    needed = (cfg.profile.num_steps + 2) * steps_per_execution
    return max(0, min(cfg.profile.start_step, total_steps - needed))


def _prepare_run_dir(cfg: Config, fresh: bool) -> tuple[Path, dict | None]:
    """Start fresh, or find where an interrupted run of the same config stopped.

    An unfinished run (checkpoints but no summary.json) of the same resolved config is
    resumed; a finished run, or `--fresh`, starts over; an unfinished run of another config
    is an error rather than a silent mix of two runs.
    """
    run_dir = cfg.run_dir
    checkpoint.remove_partial(run_dir)
    found = None if fresh or (run_dir / "summary.json").exists() else checkpoint.latest(run_dir)
    if found is not None:
        saved = run_dir / "config.yaml"
        previous = config_lib.load(saved) if saved.exists() else None
        if previous != cfg:
            changed = _differences(config_lib.to_dict(previous), config_lib.to_dict(cfg)) if previous else ["?"]
            raise UserError(
                f"{run_dir} holds an unfinished run (checkpoint {found[0].name}) of a different config "
                f"(it differs in: {', '.join(changed[:5])}). Rerun with --fresh to start over, or give this run "
                "another name (--name NAME)."
            )
        return run_dir, {"folder": str(found[0]), **found[1]}
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    return run_dir, None


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(old) | set(new))
    out = []
    for key in keys:
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out


def run(cfg: Config, config_path: str | None = None, build_hint: str = "make data", log=print,
        fresh: bool = False) -> dict:
    """Train `cfg` and return its summary (also written to runs/<name>/summary.json)."""
    spec = datasets.locate(cfg.data, build_hint)
    found = devices.detect()
    choices = devices.resolve(cfg.train, found)
    cfg = resolved_config(cfg, choices)
    if choices.strategy == "multi_worker":
        from train import distributed

        return distributed.run(cfg, spec, found, choices, config_path=config_path, build_hint=build_hint, log=log,
                               fresh=fresh)
    strategy = make_strategy(choices.strategy, cfg.train.cpu_replicas)  # before any other TensorFlow op
    replicas = strategy.num_replicas_in_sync
    batch = global_batch_size(cfg, strategy)
    check_batch_size(cfg, spec, replicas)
    if cfg.data.verify and not cfg.pipeline.skip_corrupt:
        problems = integrity.verify(spec)
        if problems:
            raise _damaged(spec, problems, build_hint)
    run_dir, resume = _prepare_run_dir(cfg, fresh)
    header = "\n".join(
        [f"Resolved config of run '{cfg.name}' on {found.describe()}."]
        + [f"auto {key}: {reason}" for key, reason in choices.reasons.items()]
    )
    config_lib.save(cfg, run_dir / "config.yaml", header)

    knobs = cfg.pipeline
    log(f"[{cfg.name}] device: {found.describe()}")
    log(f"[{cfg.name}] pipeline: {pipeline.describe(knobs, spec, spec.num_train)}")
    log(f"[{cfg.name}] precision={choices.precision} jit_compile={choices.jit_compile} "
        f"steps_per_execution={choices.steps_per_execution} strategy={choices.strategy}"
        + (f" replicas={replicas} global_batch={batch}" if replicas > 1 else "")
        + (" deterministic" if cfg.train.deterministic else ""))

    damaged, skipped = {}, []
    if knobs.skip_corrupt:
        scans = integrity.scan_dataset(spec)
        damaged = {path: scan.good for path, scan in scans.items() if scan.problems}
        skipped = [problem for scan in scans.values() for problem in scan.problems]
        if skipped:
            log(f"[{cfg.name}] skip_corrupt: skipping {integrity.describe(skipped)}")

    keras.utils.set_random_seed(cfg.train.seed)
    if cfg.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    steps = cfg.train.steps_per_epoch or pipeline.steps_per_epoch(spec.num_train, batch, knobs.drop_remainder)
    model = build_model(cfg, spec, choices, total_steps=steps * cfg.train.epochs, strategy=strategy)
    if cfg.profile.enabled and choices.steps_per_execution > 1:
        log(f"[{cfg.name}] note: with steps_per_execution={choices.steps_per_execution} xprof finds no step "
            "markers inside multi-step executions: the trace viewer works, the step-time analysis will be n/a.")

    start_epoch, start_step, history = 0, 0, {}
    if resume:
        with strategy.scope():
            checkpoint.restore(model, Path(resume["folder"]))
        start_epoch, start_step, history = resume["epoch"], resume["step_in_epoch"], resume["history"]
        log(f"[{cfg.name}] resuming from {resume['folder']} (epoch {start_epoch + 1}, step {start_step}); "
            "--fresh starts over")
    done_steps = start_epoch * steps + start_step

    warmup = warmup_steps(cfg.train.warmup_steps, steps, cfg.train.epochs - start_epoch)
    timer = StepTimer(batch, warmup, run_dir / "train")
    guard = NanGuard()
    callbacks = [guard]
    profiler = None
    if cfg.profile.enabled:
        start = _profile_window(cfg, steps * cfg.train.epochs - done_steps, choices.steps_per_execution)
        profiler = StepTraceProfiler(run_dir, start, cfg.profile.num_steps)
        callbacks.append(profiler)  # before the timer: profiler start/stop stay outside timed steps
    callbacks.append(timer)
    saver = None
    if cfg.checkpoint.enabled:
        saver = checkpoint.Checkpointer(run_dir, steps, cfg.checkpoint.every_epochs, cfg.checkpoint.every_steps,
                                        cfg.checkpoint.keep, start_global_step=done_steps, history=history)
        callbacks.append(saver)
    sampler = Sampler(cfg.monitor.interval_s) if cfg.monitor.enabled else None
    if sampler is not None:
        callbacks.append(MonitorCallback(sampler, run_dir / "system", log=lambda m: log(f"[{cfg.name}] {m}")))
    callbacks.append(keras.callbacks.TensorBoard(log_dir=str(run_dir), write_graph=False, profile_batch=0))
    watchdog = None
    timeout = guards.stall_timeout(cfg.train.stall_timeout_s, knobs.data_service)
    if timeout:
        watchdog = guards.StallWatchdog(timeout, (
            f"The tf.data service at {knobs.data_service} may have lost its workers (check that they run)."
            if knobs.data_service else "The input pipeline stopped delivering batches."))
        callbacks.append(watchdog)

    # Repeated, and read validation_steps batches at a time: exactly one pass per evaluation, also
    # where a distributed dataset hides its length from Keras (which then never restarts it).
    val_ds = pipeline.build(spec.val_files, spec, knobs, training=False, num_examples=spec.num_val,
                            seed=cfg.train.seed, damaged=damaged, batch_size=batch).repeat()
    started = time.perf_counter()
    try:
        if sampler is not None:
            sampler.start()
        for initial_epoch, epochs, segment_steps in checkpoint.plan_segments(cfg.train.epochs, steps, start_epoch,
                                                                             start_step):
            train_ds = pipeline.build(spec.train_files, spec, knobs, training=True, num_examples=spec.num_train,
                                      seed=cfg.train.seed, damaged=damaged, batch_size=batch)
            if done_steps:
                train_ds = train_ds.skip(done_steps)  # the batches already trained on, in the same order
            segment = model.fit(
                train_ds,
                initial_epoch=initial_epoch,
                epochs=epochs,
                steps_per_epoch=segment_steps,
                shuffle=False,  # the dataset shuffles itself
                validation_data=val_ds,
                validation_steps=pipeline.steps_per_epoch(spec.num_val, batch, drop_remainder=False),
                callbacks=callbacks,
                verbose=1 if sys.stdout.isatty() else 2,
            )
            for key, values in segment.history.items():
                history.setdefault(key, []).extend(float(v) for v in values)
            done_steps += (epochs - initial_epoch) * segment_steps
            if guard.tripped:
                break
    except tf.errors.ResourceExhaustedError:
        raise guards.oom_error(knobs.batch_size, found.describe(), guards.largest_batch_that_fit()) from None
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.UnknownError) as error:
        raise _data_error(error, spec, build_hint) from None
    finally:
        if sampler is not None:
            sampler.stop()
        if watchdog is not None:
            watchdog.stop()
    if guard.tripped:
        last = checkpoint.latest(run_dir)
        raise guards.nan_error(guard.tripped, str(last[0]) if last else None, cfg.train.learning_rate)
    wall = time.perf_counter() - started

    summary = {
        "name": cfg.name,
        "run_dir": str(run_dir),
        "config": config_path,
        "device": found.describe(),
        "device_kind": found.kind,
        "choices": {**dataclasses.asdict(choices)},
        "model": cfg.model.name,
        "model_params": cfg.model.params,
        "parameters": int(model.count_params()),
        "dataset": {"name": spec.name, "root": str(spec.root), "num_train": spec.num_train,
                    "num_val": spec.num_val, "image_shape": list(spec.image_shape),
                    "num_classes": spec.num_classes},
        "pipeline": pipeline.describe(knobs, spec, spec.num_train),
        "batch_size": knobs.batch_size,
        "replicas": replicas,
        "global_batch_size": batch,
        "epochs": cfg.train.epochs,
        "steps_per_epoch": steps,
        "warmup_steps": warmup,
        "resumed_from": resume["folder"] if resume else None,
        "skipped_records": len(skipped),
        "skipped_record_details": [str(problem) for problem in skipped[:100]],
        **timer.summary(),
        "final_loss": _last(history, "loss"),
        "final_accuracy": _last(history, "accuracy"),
        "val_loss": _last(history, "val_loss"),
        "val_accuracy": _last(history, "val_accuracy"),
        "history": history,
        "wall_time_s": wall,
    }
    summary.update(_profile_figures(run_dir))
    if sampler is not None:
        summary["utilization"] = sampler.summary(since=timer.steady_since or 0.0)
        summary["cpu_utilization_percent"] = (summary["utilization"]["cpu_utilization_percent"] or {}).get("mean")
        summary["gpu_utilization_percent"] = summary["utilization"]["gpu_utilization_percent"]
    if knobs.skip_corrupt:
        _write_scalar(run_dir / "train", "data/skipped_records", len(skipped))
    save_model(model, run_dir / "model.keras")
    write_json(run_dir / "summary.json", summary)  # last: a summary means the run is complete
    input_share = summary.get("input_bound_percent")
    rate = summary["examples_per_sec"]
    log(f"[{cfg.name}] " + (f"{rate:.0f} examples/s, step {summary['step_time_ms']:.1f} ms, " if rate else "")
        + (f"{input_share:.1f}% of step time waiting for input, " if input_share is not None else "")
        + f"val_accuracy {summary['val_accuracy']:.3f}  ->  {run_dir}/summary.json")
    return summary


def save_model(model: keras.Model, path: Path) -> None:
    """The trained model (architecture, weights, optimizer), written atomically."""
    tmp = path.with_name(path.stem + ".tmp.keras")
    model.save(tmp)
    tmp.replace(path)


def _write_scalar(logdir: Path, tag: str, value: float) -> None:
    writer = tf.summary.create_file_writer(str(logdir), filename_suffix=".data")
    with writer.as_default():
        tf.summary.scalar(tag, value, step=0)
    writer.close()


def _data_error(error: Exception, spec: datasets.DatasetSpec, build_hint: str) -> Exception:
    """A clear error naming the damaged shard and record, when the data is what failed."""
    problems = [p for scan in integrity.scan_dataset(spec).values() for p in scan.problems]
    return _damaged(spec, problems, build_hint) if problems else error


def _damaged(spec: datasets.DatasetSpec, problems: list, build_hint: str) -> UserError:
    return UserError(
        f"The dataset at {spec.root} is damaged: {integrity.describe(problems)}. Rebuild it (delete {spec.root} "
        f"and run {build_hint}), or set pipeline.skip_corrupt=true to train on the readable records (the count of "
        "skipped records goes into summary.json and TensorBoard)."
    )


def _profile_figures(run_dir: Path) -> dict:
    """The profiler's view of the run: input-bound share, device busy share, slow stages."""
    from train import analysis

    try:
        profile = analysis.analyze_run(run_dir)
    except analysis.ProfileError as error:
        return {"profile": {"error": str(error)}, "input_bound_percent": None, "device_busy_percent": None}
    if profile is None:
        return {"profile": None, "input_bound_percent": None, "device_busy_percent": None}
    return {
        "profile": profile,
        "input_bound_percent": profile["input_bound_percent"],
        "device_busy_percent": profile["device_busy_percent"],
    }


def _last(metrics: dict, key: str) -> float | None:
    values = metrics.get(key)
    return float(values[-1]) if values else None
