"""The scenario: an overlay applied to every variant of a comparison and to the data it builds.

Scenarios live in configs/scenarios/; `make data`, the benchmarks and `make tune` take one by name. On a
machine without a GPU the workload's CPU scenario stands in for a fast accelerator (images: a tiny
model), so the input pipeline, not the model, limits throughput, as it does on a GPU.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from train import config as config_lib
from train import workloads
from train.config import Config
from train.core import files
from train.core.errors import UserError


@dataclasses.dataclass
class Scenario:
    overlays: list[str]
    why: str  # one sentence for logs and reports

    def load(self, path: str | Path, overrides: list[str] = (), name: str | None = None) -> Config:
        return config_lib.load(files.project_file(path), list(overrides), layers=self.overlays, name=name)


def named(choice: str) -> str:
    """A bare scenario name means configs/scenarios/<name>.yaml."""
    if "/" in choice or choice.endswith((".yaml", ".yml")):
        return choice
    return f"configs/scenarios/{choice}.yaml"


def has_gpu() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def resolve(choice: str, workload: str = workloads.DEFAULT) -> Scenario:
    if choice == "none":
        return Scenario([], "no scenario overlay: every preset as written")
    if choice != "auto":
        path = files.project_file(named(choice))
        if not path.is_file():
            known = sorted(p.stem for p in (files.PROJECT_ROOT / "configs" / "scenarios").glob("*.yaml"))
            raise UserError(
                f"--scenario '{choice}' is neither a file nor a scenario in configs/scenarios/. Use auto, none, "
                f"a scenario name ({', '.join(known)}) or a YAML overlay."
            )
        return Scenario([str(path)], f"scenario {Path(path).stem} ({named(choice)})")
    if has_gpu():
        return Scenario([], "GPU found: every preset as written")
    presets = workloads.get(workload).presets
    overlay, model = presets.cpu_scenario, presets.cpu_model
    return Scenario(
        [str(files.project_file(overlay))],
        (
            f"No GPU found: running the CPU scenario that mirrors a fast GPU ({overlay}: {model}, so the "
            "input pipeline, not the model, limits throughput, as it does on an accelerator)"
        ),
    )


def for_preset(choice: str, preset: str | Path) -> Scenario:
    """`resolve` for the workload that `preset` trains (its `workload:`)."""
    return resolve(choice, config_lib.workload_of(files.project_file(preset)))
