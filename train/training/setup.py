"""One run set-up, whatever loop runs it.

    config -> every `auto` resolved for the detected devices -> strategy -> global batch
           -> data located and checked -> run folder (fresh, or where a run stopped)
           -> compiled model (train/models.py: model, loss, optimizer, metrics)
           -> ... a loop trains ...  -> summary.json (one schema)

The Keras `fit` loop (fit_loop.py), the multi-worker custom loop (multi_worker.py) and the
benchmarks (benchmarks/trials.py) all start here, so a run means the same thing wherever it
runs. Batch size has one meaning: `pipeline.batch_size` is per replica; the global batch is
derived here, once, and passed explicitly to the pipeline and the step timers.

The run folder (runs/<name>/) is the interface to everything that analyses a run:
    config.yaml          the resolved config (every `auto` replaced by the choice made, with why)
    train/, validation/  TensorBoard events: loss, metrics, examples/s, step time
    system/              TensorBoard events: CPU and GPU utilization samples
    plugins/profile/     the TensorBoard profile of a steady-state window, with step markers
    checkpoints/         the newest checkpoints, to resume an unfinished run
    model.keras          the trained model
    summary.json         the figures: examples/s, step time, accuracy, utilization, device
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from train import config as config_lib
from train import models, sources
from train.config import Config
from train.core import files
from train.core.errors import UserError
from train.input import augment, pipeline
from train.shards import integrity
from train.training import checkpoint, devices

RUN_OUTPUTS = (
    "config.yaml",
    "summary.json",
    "model.keras",
    "train",
    "validation",
    "system",
    "plugins",
    "checkpoints",
    "workers",
)


@dataclasses.dataclass
class Task:
    """Which process of a (possibly multi-worker) run this is."""

    kind: str = "local"  # local | worker | chief
    index: int = 0
    workers: int = 1
    is_chief: bool = True

    @property
    def label(self) -> str:
        return "" if self.kind == "local" else f" {self.kind} {self.index}"


@dataclasses.dataclass
class RunSetup:
    cfg: Config  # resolved: no `auto` left
    spec: sources.DatasetSpec
    found: devices.Devices
    choices: devices.Choices
    strategy: tf.distribute.Strategy
    task: Task
    global_batch: int
    steps_per_epoch: int
    config_path: str | None = None
    build_hint: str = "make data"
    resume: dict | None = None
    damaged: dict = dataclasses.field(default_factory=dict)  # shard -> readable records (skip_corrupt)
    skipped: list = dataclasses.field(default_factory=list)

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def run_dir(self) -> Path:
        return self.cfg.run_dir

    @property
    def tag(self) -> str:
        return f"[{self.cfg.name}{self.task.label}]"

    @property
    def validation_steps(self) -> int:
        """Batches in one pass over the validation split (the last one may be short)."""
        return pipeline.steps_per_epoch(self.spec.num_val, self.global_batch, drop_remainder=False)

    def build(
        self,
        files_,
        *,
        training: bool,
        seed: int | None = None,
        batch_size: int | None = None,
        num_examples: int | None = None,
    ) -> tf.data.Dataset:
        """The pipeline of this run for `files_`, batched at the global batch unless told otherwise."""
        return pipeline.build(
            files_,
            self.spec,
            self.cfg.pipeline,
            training=training,
            batch_size=batch_size or self.global_batch,
            num_examples=num_examples or (self.spec.num_train if training else self.spec.num_val),
            seed=self.cfg.train.seed if seed is None else seed,
            damaged=self.damaged,
        )


def resolve(cfg: Config, found: devices.Devices, spec: sources.DatasetSpec) -> tuple[Config, devices.Choices]:
    """`cfg` with every device- and data-dependent `auto` replaced by the choice for `found` and
    `spec` (precision, XLA, steps per execution, strategy; what to cache, where to shuffle and to
    augment), each with its reason in `choices.reasons`."""
    choices = devices.resolve(cfg.train, found)
    knobs, reasons = pipeline.resolve(cfg.pipeline, spec, spec.num_train, gpu=bool(found.gpus))
    choices.reasons.update(reasons)
    if cfg.train.deterministic and not knobs.deterministic:
        knobs = dataclasses.replace(knobs, deterministic=True)
    cfg = dataclasses.replace(cfg, pipeline=knobs)
    train = dataclasses.replace(
        cfg.train,
        precision=choices.precision,
        jit_compile=choices.jit_compile,
        steps_per_execution=choices.steps_per_execution,
        strategy=choices.strategy,
    )
    return dataclasses.replace(cfg, train=train), choices


@dataclasses.dataclass
class Plan:
    """A config made concrete for this machine: every `auto` resolved, the strategy, the global batch."""

    cfg: Config
    choices: devices.Choices
    strategy: tf.distribute.Strategy
    global_batch: int  # pipeline.batch_size (per replica) x replicas: what one step consumes

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync


def plan(cfg: Config, found: devices.Devices, spec: sources.DatasetSpec) -> Plan:
    """Resolve `cfg` for `found` and `spec`, create its strategy (before any other TensorFlow op)
    and derive the global batch, checking that it fits the training split."""
    cfg, choices = resolve(cfg, found, spec)
    strategy = make_strategy(cfg)
    check_batch_size(cfg, spec, strategy.num_replicas_in_sync)
    return Plan(cfg, choices, strategy, cfg.pipeline.batch_size * strategy.num_replicas_in_sync)


def current_task() -> Task:
    """This process's place in the cluster that TF_CONFIG describes (a local run without it)."""
    if "TF_CONFIG" not in os.environ:
        return Task()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    kind, index = resolver.task_type or "worker", resolver.task_id or 0
    cluster = resolver.cluster_spec().as_dict()
    workers = sum(len(cluster.get(name, [])) for name in ("chief", "worker"))
    is_chief = kind == "chief" or (kind == "worker" and index == 0 and "chief" not in cluster)
    return Task(kind, index, workers, is_chief)


def make_strategy(cfg: Config) -> tf.distribute.Strategy:
    """The tf.distribute strategy of a resolved config; create it before any other TensorFlow op."""
    name = cfg.train.strategy
    if name == "multi_worker":
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=cfg.train.collective_timeout_s)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if name == "mirrored":
        if not tf.config.list_physical_devices("GPU") and cfg.train.cpu_replicas > 1:
            devices.split_cpu(cfg.train.cpu_replicas)
            return tf.distribute.MirroredStrategy([f"/cpu:{index}" for index in range(cfg.train.cpu_replicas)])
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def check_batch_size(cfg: Config, spec: sources.DatasetSpec, replicas: int) -> None:
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


def build_model(
    cfg: Config,
    spec: sources.DatasetSpec,
    choices: devices.Choices,
    strategy: tf.distribute.Strategy,
    total_steps: int | None = None,
) -> keras.Model:
    """The compiled model of `cfg` under its precision policy and distribution strategy."""
    keras.mixed_precision.set_global_policy(choices.precision)
    shape = pipeline.image_shape(spec, cfg.pipeline)

    def build():
        model = models.build_model(cfg.model.name, shape, spec.num_classes, cfg.model.params)
        if cfg.pipeline.augment != "device":
            return model
        images = keras.Input(shape=shape, dtype="uint8", name="image")
        augmented = augment.device_augment_layer()(seed=cfg.train.seed, name="device_augment")(images)
        return keras.Model(images, model(augmented), name=model.name)

    initial = None
    if strategy.num_replicas_in_sync > 1:
        # Initialized outside the strategy, so that the same seed gives the same starting
        # weights with or without distribution (strategies draw initial values differently).
        initial = build()
    with strategy.scope():
        model = build()
        if initial is not None:
            model.set_weights(initial.get_weights())
        # Under mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer itself.
        model.compile(
            optimizer=models.optimizer(learning_rate(cfg, strategy.num_replicas_in_sync, total_steps)),
            loss=models.loss(),
            metrics=models.metrics(),
            jit_compile=choices.jit_compile,
            steps_per_execution=choices.steps_per_execution,
        )
    return model


def prepare(
    cfg: Config, *, config_path: str | None = None, build_hint: str = "make data", fresh: bool = False, log=print
) -> RunSetup:
    """Everything before the first step: choices, strategy, data checks, run folder, seeds."""
    spec = sources.locate(cfg.data, build_hint)
    found = devices.detect()
    made = plan(cfg, found, spec)
    cfg, choices, strategy, global_batch, replicas = (
        made.cfg,
        made.choices,
        made.strategy,
        made.global_batch,
        made.replicas,
    )
    task = current_task() if cfg.train.strategy == "multi_worker" else Task()
    steps = cfg.train.steps_per_epoch or pipeline.steps_per_epoch(
        spec.num_train, global_batch, cfg.pipeline.drop_remainder
    )
    setup = RunSetup(cfg, spec, found, choices, strategy, task, global_batch, steps, config_path, build_hint)
    if cfg.data.verify and not cfg.pipeline.skip_corrupt:
        problems = integrity.verify(spec)
        if problems:
            raise damaged_error(spec, problems, build_hint)
    if task.is_chief:
        setup.resume = _prepare_run_dir(cfg, fresh)
        header = "\n".join(
            [f"Resolved config of run '{cfg.name}' on {found.describe()}."]
            + [f"auto {key}: {reason}" for key, reason in choices.reasons.items()]
        )
        config_lib.save(cfg, cfg.run_dir / "config.yaml", header)
    else:
        found_checkpoint = None if fresh else checkpoint.latest(cfg.run_dir)
        setup.resume = {"folder": str(found_checkpoint[0]), **found_checkpoint[1]} if found_checkpoint else None

    log(f"{setup.tag} device: {found.describe()}")
    log(f"{setup.tag} pipeline: {pipeline.describe(cfg.pipeline, spec, spec.num_train, global_batch)}")
    log(
        f"{setup.tag} precision={choices.precision} jit_compile={choices.jit_compile} "
        f"steps_per_execution={choices.steps_per_execution} strategy={choices.strategy}"
        + (
            f" replicas={replicas} batch_size={cfg.pipeline.batch_size}/replica global_batch={global_batch}"
            if replicas > 1
            else ""
        )
        + (" deterministic" if cfg.train.deterministic else "")
    )
    if cfg.pipeline.skip_corrupt:
        scans = integrity.scan_dataset(spec)
        setup.damaged = {path: scan.good for path, scan in scans.items() if scan.problems}
        setup.skipped = [problem for scan in scans.values() for problem in scan.problems]
        if setup.skipped:
            log(f"{setup.tag} skip_corrupt: skipping {integrity.describe(setup.skipped)}")
    keras.utils.set_random_seed(cfg.train.seed)
    if cfg.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    return setup


def warmup_steps(setting: int | str, steps_per_epoch: int, epochs: int) -> int:
    if setting != "auto":
        return int(setting)
    return steps_per_epoch if epochs >= 2 else min(20, steps_per_epoch // 4)


def _prepare_run_dir(cfg: Config, fresh: bool) -> dict | None:
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
        return {"folder": str(found[0]), **found[1]}
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    return None


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out


def damaged_error(spec: sources.DatasetSpec, problems: list, build_hint: str) -> UserError:
    return UserError(
        f"The dataset at {spec.root} is damaged: {integrity.describe(problems)}. Rebuild it (delete {spec.root} "
        f"and run {build_hint}), or set pipeline.skip_corrupt=true to train on the readable records (the count of "
        "skipped records goes into summary.json and TensorBoard)."
    )


def data_error(error: Exception, setup: RunSetup) -> Exception:
    """A clear error naming the damaged shard and record, when the data is what failed."""
    problems = [p for scan in integrity.scan_dataset(setup.spec).values() for p in scan.problems]
    return damaged_error(setup.spec, problems, setup.build_hint) if problems else error


def weights_fingerprint(model: keras.Model) -> str:
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def summary(
    setup: RunSetup,
    model: keras.Model,
    history: dict,
    timing: dict,
    wall_s: float,
    warmup: int,
    utilization: dict | None = None,
) -> dict:
    """The figures of a finished run, in the one schema every loop writes and every report reads."""
    cfg, spec, choices = setup.cfg, setup.spec, setup.choices
    figures = (
        _profile_figures(setup.run_dir)
        if cfg.profile.enabled and setup.task.is_chief
        else {"profile": None, "input_bound_percent": None, "device_busy_percent": None}
    )
    cpu = ((utilization or {}).get("cpu_utilization_percent") or {}).get("mean")
    return {
        "name": cfg.name,
        "run_dir": str(setup.run_dir),
        "config": setup.config_path,
        "device": setup.found.describe(),
        "device_kind": setup.found.kind,
        "choices": dataclasses.asdict(choices),
        "strategy": choices.strategy,
        "workers": setup.task.workers,
        "replicas": setup.replicas,
        "batch_size": cfg.pipeline.batch_size,
        "global_batch_size": setup.global_batch,
        "model": cfg.model.name,
        "model_params": cfg.model.params,
        "parameters": int(model.count_params()),
        "dataset": {
            "name": spec.name,
            "root": str(spec.root),
            "num_train": spec.num_train,
            "num_val": spec.num_val,
            "image_shape": list(spec.image_shape),
            "num_classes": spec.num_classes,
        },
        "pipeline": pipeline.describe(cfg.pipeline, spec, spec.num_train, setup.global_batch),
        "epochs": cfg.train.epochs,
        "steps_per_epoch": setup.steps_per_epoch,
        "warmup_steps": warmup,
        "resumed_from": setup.resume["folder"] if setup.resume else None,
        "skipped_records": len(setup.skipped),
        "skipped_record_details": [str(problem) for problem in setup.skipped[:100]],
        **timing,
        "final_loss": _last(history, "loss"),
        "final_accuracy": _last(history, "accuracy"),
        "val_loss": _last(history, "val_loss"),
        "val_accuracy": _last(history, "val_accuracy"),
        "history": history,
        "wall_time_s": wall_s,
        "weights_sha256": weights_fingerprint(model),
        **figures,
        "utilization": utilization,
        "cpu_utilization_percent": cpu,
        "gpu_utilization_percent": (utilization or {}).get("gpu_utilization_percent"),
    }


def finish(setup: RunSetup, model: keras.Model, result: dict, log=print) -> dict:
    """Write what a finished run leaves: every worker its weight fingerprint, the chief the model and
    summary.json (last: a summary means the run is complete)."""
    if setup.task.kind != "local":
        files.write_json(
            setup.run_dir / "workers" / f"{setup.task.kind}-{setup.task.index}.json",
            {
                "task": f"{setup.task.kind}:{setup.task.index}",
                "weights_sha256": result["weights_sha256"],
                "epochs": result["epochs"],
                "steps_per_epoch": result["steps_per_epoch"],
                "final_loss": result["final_loss"],
            },
        )
    if not setup.task.is_chief:
        return result
    files.atomic_write(setup.run_dir / "model.keras", model.save)
    files.write_json(setup.run_dir / "summary.json", result)
    rate, input_share = result["examples_per_sec"], result["input_bound_percent"]
    log(
        f"{setup.tag} done: "
        + (f"{rate:,.0f} examples/s, step {result['step_time_ms']:.1f} ms, " if rate else "")
        + (f"{input_share:.1f}% of step time waiting for input, " if input_share is not None else "")
        + (f"val_accuracy {result['val_accuracy']:.3f}" if result["val_accuracy"] is not None else "")
        + f"  ->  {setup.run_dir}/summary.json"
    )
    return result


def _profile_figures(run_dir: Path) -> dict:
    """The profiler's view of the run: input-bound share, device busy share, slow stages."""
    from train.diagnose import analysis

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
