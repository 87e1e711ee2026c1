"""The run folder, runs/<name>/: started fresh, or found where an interrupted run stopped.

It is the interface to everything that analyses a run:
    config.yaml          the resolved config (every `auto` replaced by the choice made, with why)
    train/, validation/  TensorBoard events: loss, metrics, examples/s, step time
    system/              TensorBoard events: CPU and GPU utilization samples
    plugins/profile/     the TensorBoard profile of a steady-state window, with step markers
    checkpoints/         the newest checkpoints, to resume an unfinished run
    workers/             multi-worker runs: each worker's final weight fingerprint
    model.keras          the trained model
    summary.json         the figures (run_summary.py), written last: a run with one is complete
"""

from __future__ import annotations

import shutil

from train import config as config_lib
from train.config import Config
from train.core.errors import UserError
from train.training import checkpoint
from train.training.devices import Devices
from train.training.plan import Choices

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


def prepare(cfg: Config, fresh: bool) -> dict | None:
    """Start fresh, or find where an interrupted run of the same config stopped (its checkpoint:
    folder, epoch, step in the epoch, history).

    An unfinished run (checkpoints but no summary.json) of the same resolved config is
    resumed; a finished run, or `--fresh`, starts over; an unfinished run of another config
    is an error rather than a silent mix of two runs.
    """
    run_dir = cfg.run_dir
    checkpoint.remove_partial(run_dir)
    found = None if fresh or (run_dir / "summary.json").exists() else checkpoint.latest(run_dir)
    if found is not None:
        saved = run_dir / "config.yaml"
        try:
            previous = config_lib.load(saved) if saved.exists() else None
        except UserError as error:
            raise UserError(
                f"{run_dir} holds an unfinished run (checkpoint {found[0].name}) whose config.yaml no longer loads "
                f"({error}). Rerun with --fresh to start over, or give this run another name (--name NAME)."
            ) from None
        if previous != cfg:
            changed = differences(config_lib.to_dict(previous), config_lib.to_dict(cfg)) if previous else ["?"]
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


def resume_point(cfg: Config, fresh: bool) -> dict | None:
    """Where a worker that is not the chief resumes: the chief's newest checkpoint, unless `fresh`."""
    found = None if fresh else checkpoint.latest(cfg.run_dir)
    return {"folder": str(found[0]), **found[1]} if found else None


def save_config(cfg: Config, found: Devices, choices: Choices) -> None:
    """config.yaml: the resolved config, with every `auto` choice and its reason in the header."""
    header = "\n".join(
        [f"Resolved config of run '{cfg.name}' on {found.describe()}."]
        + [f"auto {key}: {reason}" for key, reason in choices.reasons.items()]
    )
    config_lib.save(cfg, cfg.run_dir / "config.yaml", header)


def differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two config dicts."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out
