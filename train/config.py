"""Typed configuration: YAML presets that extend a base, `--set key=value` overrides.

Every knob lives in one dataclass below with its default. Loading rejects unknown keys
(with a did-you-mean), wrong types and out-of-range values before any work starts, and
`save()` writes the resolved config into the run folder so a run can be reproduced.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from train.config_rules import PHOTO_TRANSFORMS, TRANSFORMS, _Problems, check_ranges
from train.core import files
from train.core.errors import UserError, did_you_mean
from train.workloads.text.settings import TextConfig
from train.workloads.text.settings import check as check_text

__all__ = ["PHOTO_TRANSFORMS", "TRANSFORMS", "Config", "load", "save", "to_dict"]


Auto = Literal["auto"]


@dataclass
class DataConfig:
    """Where the examples come from; the dataset is built once into sharded TFRecords."""

    source: str = "synthetic"  # synthetic | tfds:NAME | imagefolder:PATH
    data_dir: str = "shards"  # where built datasets live (git-ignored)
    image_size: int = 64  # height = width of the images fed to the model
    num_train: int = 10_000  # synthetic source only
    num_val: int = 2_000  # synthetic source only
    num_shards: int = 8  # TFRecord files per split
    val_fraction: float = 0.1  # imagefolder without train/ and val/ folders: share held out for validation
    # Check every shard's framing, CRCs and record count before training (about 1 s per GB),
    # so a damaged file stops the run before any work; switch off for very large datasets.
    verify: bool = True


@dataclass
class PipelineConfig:
    """Every knob of the one input-pipeline builder (train/input/pipeline.py)."""

    reader: Literal["python", "tfrecord"] = "tfrecord"  # python: generator + PIL decode, one record at a time
    shuffle_files: bool = True  # shuffle the shard order every epoch
    parallel_reads: Union[int, Auto] = "auto"  # shards read at once by interleave; 1 reads them one after another
    parallel_calls: Union[int, Auto] = "auto"  # parallelism of map (decode, augment); 1 is serial
    deterministic: bool = False  # False lets parallel stages hand out whichever element is ready first
    output_size: Union[int, None] = None  # side of the images fed to the model; null: as stored (data.image_size)
    # Decode JPEGs at 1/2, 1/4 or 1/8 of their size (libjpeg's DCT scaling) when stored larger than output_size.
    scaled_decode: bool = False
    # Training: a random window of 50-100 % of the area (aspect 3/4-4/3), resized to output_size; only the
    # window is decoded (decode_and_crop_jpeg). Changes what is learned, like any augmentation.
    random_crop: bool = False
    # What is kept between epochs. memory: decoded images in RAM; disk: a tf.data snapshot of decoded images
    # under cache_dir; encoded: the records (JPEG bytes) in RAM, decoded every epoch; none.
    # auto: memory when the decoded images fit in cache_limit_mb, else disk when cache_dir is set, else
    # encoded when the records fit, else none.
    cache: Literal["auto", "memory", "disk", "encoded", "none"] = "auto"
    cache_limit_mb: int = 4096
    cache_dir: Union[str, None] = None  # local folder for cache: disk (snapshots are kept for later runs)
    shuffle_buffer: int = 10_000  # elements; 0 turns the element shuffle off
    # Shuffle the encoded records instead of decoded images: a buffer of JPEG bytes, not of pixels.
    # auto: when nothing decoded is cached (a decoded cache is shuffled after it instead).
    shuffle_before_decode: Union[bool, Auto] = "auto"
    batch_size: int = 256  # per replica; the global batch is batch_size x replicas
    drop_remainder: bool = True  # static batch shape for XLA and for even replicas
    # Where augmentation runs. python: numpy in the generator; per_example: a map before batch; batched: one
    # vectorized map per batch; device: a Keras layer at the start of the model, on the accelerator; auto:
    # device where a GPU exists, batched elsewhere; none.
    augment: Literal["auto", "none", "python", "per_example", "batched", "device"] = "batched"
    # What augmentation does, each drawn per example (train/input/augment.py): flip_left_right, flip_up_down,
    # shift (vertically, up to 1/16 of the height). The default is right for photos; flip_up_down is not
    # (a sky below, a 6 read as a 9). [] augments nothing.
    transforms: list[str] = field(default_factory=lambda: list(PHOTO_TRANSFORMS))
    prefetch: Union[int, Auto] = "auto"  # batches prepared ahead of the model; 0 turns it off
    autotune: bool = True  # let tf.data tune parallelism and buffer sizes
    private_threadpool_size: int = 0  # 0 uses TensorFlow's shared inter-op pool
    max_intra_op_parallelism: int = 0  # 0 lets one op use every core; 1 keeps ops from fighting the model for cores
    skip_corrupt: bool = False  # skip damaged records (found by a scan before training, counted in the summary)
    data_service: Union[str, None] = None  # grpc://HOST:PORT of a tf.data service dispatcher
    data_service_mode: Literal["parallel_epochs", "distributed_epoch"] = "parallel_epochs"


@dataclass
class ModelConfig:
    """A model from the registry (train/models.py); other keys are that model's parameters."""

    name: str = "resnet"
    params: dict = field(default_factory=dict)


@dataclass
class TrainConfig:
    epochs: int = 10
    learning_rate: float = 0.005  # peak; cosine decay to 1 % of it over the run
    steps_per_epoch: Union[int, None] = None  # None: one pass over the training split
    # Excluded from the steady-state examples/s and step time. auto: the whole first epoch
    # (tracing, autotuning and filling the cache happen there) when there are 2+ epochs.
    warmup_steps: Union[int, Auto] = "auto"
    # auto: fastest on this device; mixed: this device's mixed policy even where it is slower
    precision: Literal["auto", "mixed", "float32", "mixed_float16", "mixed_bfloat16"] = "auto"
    jit_compile: Union[bool, Auto] = "auto"  # XLA
    steps_per_execution: Union[int, Auto] = "auto"
    strategy: Literal["auto", "default", "mirrored", "multi_worker"] = "auto"
    # With several replicas, pipeline.batch_size is per replica: the global batch is
    # batch_size x replicas, and the learning rate is multiplied by the replica count
    # (the linear scaling rule) unless scale_learning_rate is false.
    scale_learning_rate: bool = True
    cpu_replicas: int = 1  # no GPU: split the CPU into N logical devices and mirror over them (to try it)
    collective_timeout_s: float = 120.0  # multi_worker: a collective that waits longer fails instead of hanging
    # Stop with a clear error when no batch arrives for this long (a lost tf.data service worker,
    # a dead reader); auto: 300 s with pipeline.data_service, off otherwise; 0: off.
    stall_timeout_s: Union[float, Auto] = "auto"
    seed: int = 0
    # Reproducible runs: TensorFlow op determinism and an ordered pipeline (pipeline.deterministic
    # is forced on); a resumed run then ends with exactly the weights of an uninterrupted one.
    deterministic: bool = False


@dataclass
class CheckpointConfig:
    """Saving progress, so that rerunning the same command after a crash resumes."""

    enabled: bool = True
    every_epochs: int = 1
    every_steps: int = 0  # also save every N steps within an epoch (0: only at epoch ends)
    keep: int = 2  # newest checkpoints kept


@dataclass
class ProfileConfig:
    """A TensorBoard profile of a window of steady-state steps, with real step markers."""

    enabled: bool = True
    start_step: int = 30
    num_steps: int = 10


@dataclass
class MonitorConfig:
    """Background sampling of GPU (NVML) and CPU utilization during training."""

    enabled: bool = True
    interval_s: float = 0.5


@dataclass
class Config:
    name: str = "run"
    description: str = ""
    runs_dir: str = "runs"
    # image: data/pipeline sections, built by train/input/pipeline.py; text: the `text:` section (text.data,
    # text.pipeline: train/workloads/text/settings.py), built by train/workloads/text/pipeline.py. The rest is shared.
    task: Literal["image", "text"] = "image"
    data: DataConfig = field(default_factory=DataConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    text: TextConfig = field(default_factory=TextConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is list:
        return isinstance(value, list) and all(_matches(item, typing.get_args(tp)[0]) for item in value)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def _build(cls: type, values: dict, where: str, source: str) -> Any:
    """Instantiate dataclass `cls` from `values`, rejecting unknown keys and wrong types."""
    if not isinstance(values, dict):
        raise UserError(f"{source}: '{where or 'the top level'}' must be a mapping of keys to values, got {values!r}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if cls is ModelConfig:
        values = {
            "name": values.get("name", ModelConfig.name),
            "params": {k: v for k, v in values.items() if k != "name"},
        }
    kwargs = {}
    for key, value in values.items():
        dotted = f"{where}.{key}" if where else key
        if key not in fields:
            raise UserError(
                f"{source}: unknown key '{dotted}'.{_suggest(cls, key, where, fields)} "
                f"Valid keys{' under ' + repr(where) if where else ''}: {', '.join(fields)}. "
                "Fix or remove the key and run again."
            )
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, dotted, source)
            continue
        if isinstance(value, int) and not isinstance(value, bool) and tp is float:
            value = float(value)
        if not _matches(value, tp):
            raise UserError(
                f"{source}: '{dotted}' must be {_type_name(tp)}, got {value!r}. "
                f"Set it to a valid value, e.g. --set {dotted}={_example(tp, fields[key])}."
            )
        kwargs[key] = value
    return cls(**kwargs)


def _suggest(cls: type, key: str, where: str, fields: dict) -> str:
    """' Did you mean ...?': a key of exactly one section when given bare, else the closest name here."""
    if cls is Config:
        sections = [
            name
            for name, tp in typing.get_type_hints(Config).items()
            if dataclasses.is_dataclass(tp) and key in {f.name for f in dataclasses.fields(tp)}
        ]
        if len(sections) == 1:
            return f" Did you mean '{sections[0]}.{key}'?"
    return did_you_mean(key, fields)


def _example(tp: Any, f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING and f.default is not None:
        default = f.default
        return str(default).lower() if isinstance(default, bool) else str(default)
    args = typing.get_args(tp)
    return str(args[0]) if args else "..."


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if key == "model" and _switches_model(merged.get(key), value):
            merged[key] = value  # another model's parameters would not apply
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _switches_model(base, override) -> bool:
    return (
        isinstance(base, dict)
        and isinstance(override, dict)
        and override.get("name", base.get("name")) != base.get("name")
    )


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """Read one preset, following `extends:` (relative to the file) into a merged dict."""
    path = path.resolve()
    if path in seen:
        raise UserError(f"{path}: 'extends' forms a cycle ({' -> '.join(str(p) for p in seen + (path,))}).")
    if not path.is_file():
        presets = sorted(str(p) for p in Path("configs").glob("*.yaml")) if Path("configs").is_dir() else []
        raise UserError(
            f"Config file '{path}' does not exist. Pass an existing file to --config"
            + (f", e.g. one of: {', '.join(presets)}." if presets else ".")
        )
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise UserError(f"{path} is not valid YAML ({error}). Fix the syntax and run again.") from None
    if not isinstance(values, dict):
        raise UserError(f"{path} must hold a mapping of keys to values, not {type(values).__name__}.")
    parent = values.pop("extends", None)
    if parent is None:
        return values
    if not isinstance(parent, str):
        raise UserError(f"{path}: 'extends' must be a file name, got {parent!r}.")
    return _merge(_read_yaml(path.parent / parent, seen + (path,)), values)


def parse_override(text: str) -> tuple[list[str], Any]:
    """'pipeline.batch_size=64' -> (['pipeline', 'batch_size'], 64); values are parsed as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--set '{text}' must look like key=value, e.g. --set pipeline.batch_size=64.")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def load(
    path: str | Path | None = None, overrides: list[str] = (), name: str | None = None, layers: list[str | Path] = ()
) -> Config:
    """Load a preset (or the defaults), merge `layers` (partial presets) and `--set` overrides.

    Everything is validated before anything runs; the first problem is raised as UserError.
    """
    values = _read_yaml(Path(path)) if path else {}
    if path and "name" not in values:
        values["name"] = Path(path).stem
    for layer in layers:
        values = _merge(values, _read_yaml(Path(layer)))
    for text in overrides:
        keys, value = parse_override(text)
        if keys == ["model", "name"] and _switches_model(values.get("model"), {"name": value}):
            values["model"] = {}
        node = values
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise UserError(f"--set '{text}': '{key}' is a value, not a section.")
        node[keys[-1]] = value
    if name:
        values["name"] = name
    source = " + ".join([str(path) if path else "config"] + [str(layer) for layer in layers])
    if overrides:
        source += " (with --set " + " ".join(overrides) + ")"
    cfg = _build(Config, values, "", source)
    check_ranges(cfg, source)
    if cfg.task == "text":
        problems = _Problems()
        check_text(cfg.text, problems.need)
        if problems:
            raise UserError(f"{source}: " + "; ".join(problems) + ". Fix the value(s) and run again.")
        # The text models register themselves where they are defined (Keras layers of their own).
        from train.core.quiet import import_tensorflow

        import_tensorflow()
        from train.workloads.text import model as _registers_the_text_models  # noqa: F401
    from train import models

    cfg.model.params = models.resolve_params(cfg.model.name, cfg.model.params, source)
    return cfg


def task_of(path: str | Path) -> str:
    """The task a preset trains (its `task:`, following `extends:`), read without building the config: the
    commands that take presets choose the task's scenario and presets from it."""
    task = _read_yaml(Path(path)).get("task", Config.task)
    return task if task in typing.get_args(typing.get_type_hints(Config)["task"]) else Config.task


def to_dict(cfg: Config) -> dict:
    values = dataclasses.asdict(cfg)
    values["model"] = {"name": cfg.model.name, **cfg.model.params}
    return values


def save(cfg: Config, path: Path, header: str = "") -> None:
    """Write the resolved config; `load(path)` reads it back unchanged."""
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_text(path, comment + text)
