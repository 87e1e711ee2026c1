"""What every benchmark command does first: pick the scenario, load its configs, build the data.

A scenario is an overlay applied to every variant of a comparison (configs/scenarios/). On a
machine without a GPU the CPU scenario stands in for a fast accelerator: a tiny model, so the
input pipeline, not the model, limits throughput, as it does on a GPU.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from train import config as config_lib
from train import files, sources
from train.config import Config
from train.errors import UserError

CPU_SCENARIO = "configs/scenarios/cpu.yaml"


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


def resolve(choice: str) -> Scenario:
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
    return Scenario(
        [str(files.project_file(CPU_SCENARIO))],
        (
            f"No GPU found: running the CPU scenario that mirrors a fast GPU ({CPU_SCENARIO}: a tiny model, so the "
            "input pipeline, not the model, limits throughput, as it does on an accelerator)"
        ),
    )


def begin(scenario: Scenario, configs: list[Config], out: Path | None = None, clean: bool = False):
    """Say which scenario runs, build the dataset, set the devices up; returns (spec, found devices).

    TensorFlow fixes its devices at first use, so a CPU split for mirrored variants
    (train.cpu_replicas) happens here, before any variant is built.
    """
    from train.training import devices

    print(scenario.why + ".", flush=True)
    spec, built = sources.prepare(configs[0].data)
    if built:
        print(f"Built the dataset at {spec.root}.", flush=True)
    mirrored = [cfg.train.cpu_replicas for cfg in configs if cfg.train.strategy == "mirrored"]
    if mirrored and max(mirrored) > 1 and not has_gpu():
        devices.split_cpu(max(mirrored))
    found = devices.detect()
    if out is not None:
        if clean and out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
    return spec, found
