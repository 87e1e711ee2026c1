"""One training run: config -> device choices -> pipeline -> model -> `model.fit` -> run folder.

The run folder (runs/<name>/) is the interface to everything that analyses a run:
    config.yaml        the resolved config (every `auto` replaced by the choice made here)
    train/, validation/  TensorBoard events: loss, accuracy, examples/s, step time
    system/            TensorBoard events: CPU and GPU utilization samples
    plugins/profile/   the TensorBoard profile of a steady-state window, with step markers
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

from train import config as config_lib
from train import datasets, devices, models, pipeline
from train.config import Config
from train.errors import UserError
from train.monitor import MonitorCallback, Sampler
from train.profiling import StepTraceProfiler
from train.throughput import StepTimer

RUN_OUTPUTS = ("config.yaml", "summary.json", "train", "validation", "system", "plugins")


def write_json(path: Path, payload: dict) -> None:
    """Write JSON atomically: readers never see a half-written file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    tmp.replace(path)


def _fresh_run_dir(run_dir: Path) -> None:
    """Clear what an earlier run of the same name wrote, so events and profiles don't mix."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def resolved_config(cfg: Config, choices: devices.Choices) -> Config:
    train = dataclasses.replace(
        cfg.train,
        precision=choices.precision,
        jit_compile=choices.jit_compile,
        steps_per_execution=choices.steps_per_execution,
        strategy=choices.strategy,
    )
    return dataclasses.replace(cfg, train=train)


def _strategy(name: str) -> tf.distribute.Strategy:
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def check_batch_size(cfg: Config, spec: datasets.DatasetSpec) -> None:
    knobs = cfg.pipeline
    if knobs.drop_remainder and knobs.batch_size > spec.num_train:
        raise UserError(
            f"pipeline.batch_size ({knobs.batch_size}) is larger than the training split of {spec.root} "
            f"({spec.num_train} examples), so drop_remainder would leave no batch at all. Lower "
            f"pipeline.batch_size or set pipeline.drop_remainder=false."
        )


def build_model(cfg: Config, spec: datasets.DatasetSpec, choices: devices.Choices,
                total_steps: int | None = None) -> keras.Model:
    """The compiled model of `cfg`, under its precision policy and distribution strategy.

    With `total_steps` the learning rate follows a cosine decay to 1 % over the run, so the
    last epochs settle instead of jumping around the minimum.
    """
    keras.mixed_precision.set_global_policy(choices.precision)
    learning_rate = cfg.train.learning_rate
    if total_steps:
        learning_rate = keras.optimizers.schedules.CosineDecay(learning_rate, decay_steps=total_steps, alpha=0.01)
    with _strategy(choices.strategy).scope():
        model = models.build_model(cfg.model.name, spec.image_shape, spec.num_classes, cfg.model.params)
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate),
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


def run(cfg: Config, config_path: str | None = None, build_hint: str = "make data", log=print) -> dict:
    """Train `cfg` and return its summary (also written to runs/<name>/summary.json)."""
    spec = datasets.locate(cfg.data, build_hint)
    found = devices.detect()
    choices = devices.resolve(cfg.train, found)
    cfg = resolved_config(cfg, choices)
    check_batch_size(cfg, spec)
    run_dir = cfg.run_dir
    _fresh_run_dir(run_dir)
    header = "\n".join(
        [f"Resolved config of run '{cfg.name}' on {found.describe()}."]
        + [f"auto {key}: {reason}" for key, reason in choices.reasons.items()]
    )
    config_lib.save(cfg, run_dir / "config.yaml", header)

    knobs = cfg.pipeline
    log(f"[{cfg.name}] device: {found.describe()}")
    log(f"[{cfg.name}] pipeline: {pipeline.describe(knobs, spec, spec.num_train)}")
    log(f"[{cfg.name}] precision={choices.precision} jit_compile={choices.jit_compile} "
        f"steps_per_execution={choices.steps_per_execution} strategy={choices.strategy}")

    keras.utils.set_random_seed(cfg.train.seed)
    train_ds = pipeline.build(spec.train_files, spec, knobs, training=True,
                              num_examples=spec.num_train, seed=cfg.train.seed)
    val_ds = pipeline.build(spec.val_files, spec, knobs, training=False,
                            num_examples=spec.num_val, seed=cfg.train.seed)
    steps = cfg.train.steps_per_epoch or pipeline.steps_per_epoch(spec.num_train, knobs.batch_size,
                                                                   knobs.drop_remainder)
    model = build_model(cfg, spec, choices, total_steps=steps * cfg.train.epochs)
    if cfg.profile.enabled and choices.steps_per_execution > 1:
        log(f"[{cfg.name}] note: with steps_per_execution={choices.steps_per_execution} xprof finds no step "
            "markers inside multi-step executions: the trace viewer works, the step-time analysis will be n/a.")
    warmup = warmup_steps(cfg.train.warmup_steps, steps, cfg.train.epochs)
    timer = StepTimer(knobs.batch_size, warmup, run_dir / "train")
    callbacks = []
    profiler = None
    if cfg.profile.enabled:
        start = _profile_window(cfg, steps * cfg.train.epochs, choices.steps_per_execution)
        profiler = StepTraceProfiler(run_dir, start, cfg.profile.num_steps)
        callbacks.append(profiler)  # before the timer: profiler start/stop stay outside timed steps
    callbacks.append(timer)
    sampler = None
    if cfg.monitor.enabled:
        sampler = Sampler(cfg.monitor.interval_s)
        callbacks.append(MonitorCallback(sampler, run_dir / "system", log=lambda m: log(f"[{cfg.name}] {m}")))
    callbacks.append(keras.callbacks.TensorBoard(log_dir=str(run_dir), write_graph=False, profile_batch=0))

    started = time.perf_counter()
    history = model.fit(
        train_ds,
        epochs=cfg.train.epochs,
        steps_per_epoch=steps,
        shuffle=False,  # the dataset shuffles itself
        validation_data=val_ds,
        validation_steps=pipeline.steps_per_epoch(spec.num_val, knobs.batch_size, drop_remainder=False),
        callbacks=callbacks,
        verbose=1 if sys.stdout.isatty() else 2,
    )
    wall = time.perf_counter() - started

    metrics = history.history
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
        "epochs": cfg.train.epochs,
        "steps_per_epoch": steps,
        "warmup_steps": warmup,
        **timer.summary(),
        "final_loss": _last(metrics, "loss"),
        "final_accuracy": _last(metrics, "accuracy"),
        "val_loss": _last(metrics, "val_loss"),
        "val_accuracy": _last(metrics, "val_accuracy"),
        "history": {k: [float(x) for x in v] for k, v in metrics.items()},
        "wall_time_s": wall,
    }
    summary.update(_profile_figures(run_dir))
    if sampler is not None:
        summary["utilization"] = sampler.summary(since=timer.steady_since or 0.0)
        summary["cpu_utilization_percent"] = (summary["utilization"]["cpu_utilization_percent"] or {}).get("mean")
        summary["gpu_utilization_percent"] = summary["utilization"]["gpu_utilization_percent"]
    write_json(run_dir / "summary.json", summary)
    input_share = summary.get("input_bound_percent")
    log(f"[{cfg.name}] {summary['examples_per_sec']:.0f} examples/s, step {summary['step_time_ms']:.1f} ms, "
        + (f"{input_share:.1f}% of step time waiting for input, " if input_share is not None else "")
        + f"val_accuracy {summary['val_accuracy']:.3f}  ->  {run_dir}/summary.json")
    return summary


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
