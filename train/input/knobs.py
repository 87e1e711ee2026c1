"""The knobs every pipeline builder shares: how records are read, shuffled, batched and prefetched.

Each workload's pipeline settings extend `ReadKnobs` with knobs of their own (the image pipeline's
decode, cache and augmentation; the text pipeline's batching by length), so the shared ones are
declared, documented and checked once. No TensorFlow here: a config is loaded without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

Auto = Literal["auto"]


@dataclass
class ReadKnobs:
    # python: a generator reads (and decodes or tokenizes) one example at a time in Python;
    # tfrecord: tf.data reads the shards written when the dataset was built
    reader: Literal["python", "tfrecord"] = "tfrecord"
    shuffle_files: bool = True  # shuffle the shard order every epoch
    parallel_reads: Union[int, Auto] = "auto"  # shards read at once by interleave; 1 reads them one after another
    parallel_calls: Union[int, Auto] = "auto"  # parallelism of the maps (decode, parse, augment); 1 is serial
    deterministic: bool = False  # False lets parallel stages hand out whichever element is ready first
    shuffle_buffer: int = 10_000  # elements; 0 turns the element shuffle off
    batch_size: int = 256  # per replica; the global batch is batch_size x replicas
    drop_remainder: bool = True  # training: only full batches (a static shape for XLA, even replicas)
    prefetch: Union[int, Auto] = "auto"  # batches prepared ahead of the model; 0 turns it off
    autotune: bool = True  # let tf.data tune parallelism and buffer sizes


def check(knobs: ReadKnobs, need, prefix: str) -> None:
    """The shared knobs' ranges; `need(ok, key, value, rule)` collects the problems (config_rules.Problems)."""
    for key in ("parallel_reads", "parallel_calls"):
        value = getattr(knobs, key)
        need(value == "auto" or value >= 1, f"{prefix}.{key}", value, "'auto' or >= 1")
    need(knobs.prefetch == "auto" or knobs.prefetch >= 0, f"{prefix}.prefetch", knobs.prefetch, "'auto' or >= 0")
    need(knobs.shuffle_buffer >= 0, f"{prefix}.shuffle_buffer", knobs.shuffle_buffer, ">= 0")
    need(knobs.batch_size >= 1, f"{prefix}.batch_size", knobs.batch_size, ">= 1")
