"""What tune searches: the knobs that change speed and not what is learned, each with its candidates.

Each workload lists its own (`Workload.tune_space`: images, train/workloads/image/tuning.py; text,
train/workloads/text/tuning.py), most promising first, with the train knobs every workload shares
(steps per execution, precision, XLA: train/core/tuning.py). The batch size only when asked
(`batch=True`), and then the learning rate moves with it (linear scaling rule).
"""

from __future__ import annotations

from train import workloads
from train.core.errors import UserError
from train.core.tuning import Knob, shuffle_floor
from train.workloads.base import get

__all__ = ["Knob", "get", "plan", "shuffle_floor"]


def plan(cfg, spec, found, *, replicas: int = 1, batch: bool = False, only: list[str] = ()) -> list[Knob]:
    """The knobs and their candidates for this config, dataset and machine, in search order.

    `cfg` is the start config as loaded (unresolved). Candidates equal to the current value,
    invalid ones and caches that do not fit are skipped when their turn comes (`vet`).
    """
    knobs = workloads.get(cfg.workload).tune_space(cfg, spec, found, replicas=replicas, batch=batch)
    if not only:
        return knobs
    unknown = set(only) - {k.key for k in knobs}
    if unknown:
        raise UserError(
            f"--only {', '.join(sorted(unknown))}: not a knob tune searches here. "
            f"Searched: {', '.join(k.key for k in knobs)}."
        )
    return [k for k in knobs if k.key in only]
