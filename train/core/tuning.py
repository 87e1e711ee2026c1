"""What `make tune` searches, as data: a knob and its candidates (each workload lists its own), and the train
knobs every workload shares (steps per execution, precision, XLA), chosen for the machine's devices."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class Knob:
    key: str  # dotted config key
    values: list  # candidates, most promising first
    why: str = ""
    also: Callable[[Any], dict] | None = None  # keys that move with this one (batch size -> learning rate)

    def apply(self, best: dict, value: Any) -> dict:
        state = {**best, self.key: value}
        if self.also:
            state.update(self.also(value))
        return state


def dedupe(values: list) -> list:
    seen, out = set(), []
    for value in values:
        key = json.dumps(value)
        if key not in seen:
            seen.add(key)
            out.append(value)
    return out


def shuffle_floor(global_batch: int, num_train: int) -> int:
    """The smallest shuffle buffer tune may choose: max(1000, 10 batches), at most the training split.

    A batch is drawn from the buffer only: with a smaller one, neighbouring records (the same
    shard, the order they were written in) land in the same batch and batches stop being a
    fair sample, which changes the gradient noise and so what is learned. Above the floor,
    a smaller buffer only saves memory and the time to refill it at each epoch.
    """
    return min(num_train, max(1000, 10 * global_batch))


def train_knobs(found) -> list[Knob]:
    """steps per execution, precision, XLA: the same for every workload, the candidates per device."""
    if found.gpus:
        tensor_cores = min(found.compute_capabilities) >= (7, 0)
        precisions = (["mixed_float16"] if tensor_cores else []) + ["float32"]
    else:
        # mixed_bfloat16 without bf16 units measured ~7x slower: not worth a trial
        precisions = (["mixed_bfloat16"] if found.cpu_bf16 else []) + ["float32"]
    return [
        Knob("train.steps_per_execution", [16, 4, 1], "steps per host round trip"),
        Knob("train.precision", precisions, "math precision (weights stay float32)"),
        Knob("train.jit_compile", [True, False], "XLA (one compile per input shape)"),
    ]
