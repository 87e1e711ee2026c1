"""Typed configuration: YAML presets that extend a base, `--set key=value` overrides.

Every knob lives in a dataclass with its default: the sections every run has (model, train,
checkpoint, profile, monitor) below, and the sections of the config's workload (`workload:`, e.g.
the image workload's `data` and `pipeline`) in that workload's settings.py (train/workloads/). Loading
rejects unknown keys (with a did-you-mean), wrong types and out-of-range values before any work
starts, imports no TensorFlow, and `save()` writes the resolved config into the run folder so a
run can be reproduced.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from train import models, workloads
from train.config_rules import check_ranges
from train.core import files
from train.core.errors import UserError, did_you_mean

__all__ = ["Config", "load", "save", "to_dict", "workload_of"]


Auto = Literal["auto"]


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
    # What is trained (train/workloads/__init__.py): image (the presets in configs/), text (configs/text/), yours.
    # Its sections (image: data, pipeline; text: text) are typed by its settings.py and read as attributes:
    # cfg.pipeline, cfg.text. (`task:`, the key's earlier name, is read as `workload:`.)
    workload: str = workloads.DEFAULT
    sections: dict = field(default_factory=dict)  # section name -> its dataclass, as the workload declares them
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name

    def __getattr__(self, name: str):
        sections = self.__dict__.get("sections") or {}
        if name in sections:
            return sections[name]
        raise AttributeError(
            f"'{name}' is not a section of this config (workload {self.__dict__.get('workload')!r} has: "
            f"{', '.join(sections) or 'none'})"
        )

    def with_section(self, name: str, value) -> Config:
        return dataclasses.replace(self, sections={**self.sections, name: value})


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


def _build(cls: type, values: dict, where: str, source: str, sections: dict = {}) -> Any:  # noqa: B006 (read only)
    """Instantiate dataclass `cls` from `values`, rejecting unknown keys and wrong types (`sections`: the
    workload's section classes, keys of a Config beside its fields)."""
    if not isinstance(values, dict):
        raise UserError(f"{source}: '{where or 'the top level'}' must be a mapping of keys to values, got {values!r}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "sections"}
    if cls is ModelConfig:
        values = {
            "name": values.get("name", ModelConfig.name),
            "params": {k: v for k, v in values.items() if k != "name"},
        }
    kwargs = {}
    for key, value in values.items():
        dotted = f"{where}.{key}" if where else key
        if key not in fields:
            valid = list(fields) + (list(sections) if cls is Config else [])
            raise UserError(
                f"{source}: unknown key '{dotted}'.{_suggest(cls, key, fields, sections)} "
                f"Valid keys{' under ' + repr(where) if where else ''}: {', '.join(valid)}. "
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


def _suggest(cls: type, key: str, fields: dict, sections: dict) -> str:
    """' Did you mean ...?': a key of exactly one section when given bare, else the closest name here."""
    if cls is Config:
        candidates = {
            name: tp for name, tp in typing.get_type_hints(Config).items() if dataclasses.is_dataclass(tp)
        } | dict(sections)
        matches = [name for name, tp in candidates.items() if key in {f.name for f in dataclasses.fields(tp)}]
        if len(matches) == 1:
            return f" Did you mean '{matches[0]}.{key}'?"
        return did_you_mean(key, list(fields) + list(sections))
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
    cfg = build(values, source)
    check_ranges(cfg, source, workloads.settings(cfg.workload).check)
    # the workload's settings registered its models (train/models.py's, or its own): no TensorFlow until one is built
    cfg.model.params = models.resolve_params(cfg.model.name, cfg.model.params, source)
    return cfg


def build(values: dict, source: str) -> Config:
    """A whole config from a preset's merged values: the shared sections and those of its workload."""
    values = dict(values)
    if "task" in values:  # the key's earlier name
        task = values.pop("task")
        if values.setdefault("workload", task) != task:
            raise UserError(
                f"{source}: 'task' (the earlier name of 'workload') is {task!r} but 'workload' is "
                f"{values['workload']!r}. Keep 'workload' only."
            )
    name = values.get("workload", workloads.DEFAULT)
    if not isinstance(name, str) or name not in workloads.REGISTERED:
        raise UserError(
            f"{source}: 'workload' must be {' or '.join(map(repr, workloads.names()))}, got {name!r}. A workload "
            "is registered in train/workloads/__init__.py (docs/make-it-yours.md)."
        )
    own = workloads.settings(name).SECTIONS
    sections = {key: _build(cls, values.pop(key, {}), key, source) for key, cls in own.items()}
    cfg = _build(Config, values, "", source, own)
    cfg.sections = sections
    return cfg


def workload_of(path: str | Path) -> str:
    """The workload a preset trains (its `workload:`, following `extends:`), read without building the config:
    the commands that take presets choose the workload's scenario and presets from it."""
    values = _read_yaml(Path(path))
    name = values.get("workload", values.get("task", workloads.DEFAULT))
    return name if name in workloads.REGISTERED else workloads.DEFAULT


def to_dict(cfg: Config) -> dict:
    values = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == "sections":
            values.update({name: dataclasses.asdict(section) for name, section in value.items()})
        elif f.name == "model":
            values["model"] = {"name": value.name, **value.params}
        else:
            values[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return values


def save(cfg: Config, path: Path, header: str = "") -> None:
    """Write the resolved config; `load(path)` reads it back unchanged."""
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_text(path, comment + text)
