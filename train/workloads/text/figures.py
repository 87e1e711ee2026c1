"""What a text pipeline's batches cost: real tokens, padded slots, padding share, distinct shapes.

A slot is one position of a batch's token-id tensor; a real token is a slot whose id is not 0 (the
padding id). The number of distinct input shapes is the number of XLA compiles a jit-compiled
train step needs (one per shape; Keras retraces nothing when shapes are left unknown, but XLA
compiles each concrete shape). A run summary reports real tokens/s and padded slots/s from these
counts and the step times.
"""

from __future__ import annotations

import dataclasses

import numpy as np


def token_ids_of(batch):
    """The token-id tensor of a pipeline element: (ids, labels) or packed ({token_ids, ...}, labels, weights)."""
    inputs = batch[0]
    return inputs["token_ids"] if isinstance(inputs, dict) else inputs


def examples_of(batch) -> int:
    """Texts in a batch (packed rows hold several: their count is the weights' sum)."""
    if len(batch) == 3:
        return int(np.asarray(batch[2]).sum())
    return int(np.shape(batch[1])[0])


@dataclasses.dataclass
class BatchFigures:
    """Counts accumulated over batches (`add` each one)."""

    batches: int = 0
    examples: int = 0
    real_tokens: int = 0
    slots: int = 0
    shapes: dict = dataclasses.field(default_factory=dict)  # (rows, length) -> batches of that shape

    def add(self, batch) -> None:
        ids = np.asarray(token_ids_of(batch))
        self.batches += 1
        self.examples += examples_of(batch)
        self.real_tokens += int(np.count_nonzero(ids))
        self.slots += int(ids.size)
        shape = tuple(int(n) for n in ids.shape)
        self.shapes[shape] = self.shapes.get(shape, 0) + 1

    @property
    def padded_slots(self) -> int:
        return self.slots - self.real_tokens

    @property
    def padding_share(self) -> float:
        return self.padded_slots / self.slots if self.slots else 0.0

    @property
    def distinct_shapes(self) -> int:
        return len(self.shapes)

    def rates(self, seconds: float) -> dict:
        """Real tokens/s, padded slots/s, slots/s and texts/s over `seconds` of these batches."""
        per = 1.0 / seconds if seconds > 0 else float("nan")
        return {
            "real_tokens_per_s": self.real_tokens * per,
            "padded_slots_per_s": self.padded_slots * per,
            "slots_per_s": self.slots * per,
            "examples_per_s": self.examples * per,
        }

    def as_dict(self) -> dict:
        return {
            "batches": self.batches,
            "examples": self.examples,
            "real_tokens": self.real_tokens,
            "padded_slots": self.padded_slots,
            "padding_share": self.padding_share,
            "distinct_shapes": self.distinct_shapes,
            "shapes": {f"{rows}x{length}": count for (rows, length), count in sorted(self.shapes.items())},
        }


def of_batches(batches) -> BatchFigures:
    """The figures of an iterable of batches (e.g. `dataset.take(n)`)."""
    figures = BatchFigures()
    for batch in batches:
        figures.add(batch)
    return figures


def count_compiles(dump_dir) -> int:
    """XLA compiles of a process started with XLA_FLAGS=--xla_dump_to=DIR: one module per compile, named
    module_NNNN.<cluster>.<stage>.txt; counted by module number, so the stages of one compile count once."""
    from pathlib import Path

    names = {path.name.split(".", 1)[0] for path in Path(dump_dir).glob("module_*.txt")}
    return len(names)
