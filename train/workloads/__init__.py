"""The workloads, by name: what a config's `workload:` may say, and where each one lives.

A workload is one folder (image/, text/, or a package of your own anywhere importable) holding two
modules the registry reads:

    settings.py   its config sections, typed (dataclasses), their range rules (`check`) and the models
                  it registers: read when a config is loaded, so no TensorFlow there
    workload.py   `WORKLOAD`, an instance of base.Workload: its dataset, pipeline, model, figures and
                  tune space; imported when something runs it

Training, the CLI and the benchmarks ask the workload a config names (`get(cfg.workload)`) and never
its name. Adding one is its folder and one line in REGISTERED (docs/make-it-yours.md).
"""

from __future__ import annotations

import importlib

DEFAULT = "image"  # a config without `workload:` (the presets in configs/)
REGISTERED = {
    "image": "train.workloads.image",  # image classification: configs/*.yaml, data/, train/sources.py, models.py
    "text": "train.workloads.text",  # text classification: configs/text/*.yaml (docs/text.md)
}
_LOADED: dict = {}


def register(name: str, package: str) -> None:
    """Register (or replace) a workload: `package` holds its settings.py and workload.py."""
    REGISTERED[name] = package
    _LOADED.pop(name, None)


def names() -> list[str]:
    return list(REGISTERED)


def _package(name: str) -> str:
    from train.core.errors import UserError, did_you_mean

    if name not in REGISTERED:
        raise UserError(
            f"Unknown workload '{name}'.{did_you_mean(str(name), REGISTERED)} Registered workloads: "
            f"{', '.join(REGISTERED)} (train/workloads/__init__.py)."
        )
    return REGISTERED[name]


def settings(name: str):
    """The settings module of workload `name` (its sections, `check`, its models), without TensorFlow."""
    return importlib.import_module(f"{_package(name)}.settings")


def get(name: str):
    """The workload called `name` (its base.Workload instance)."""
    if name not in _LOADED:
        _LOADED[name] = importlib.import_module(f"{_package(name)}.workload").WORKLOAD
    return _LOADED[name]


def of_record(record: dict):
    """The workload a result written earlier (summary.json, a benchmark's JSON) was measured on."""
    return get(record.get("workload") or record.get("task") or DEFAULT)  # `task`: what results said before
