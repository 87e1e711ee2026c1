"""What tune searches: the knobs that change speed and not what is learned, each with its candidates.

Parallelism, caching, prefetch, thread pools, where augmentation runs, DCT-scaled decoding (a
slightly different resize, only where images are stored larger than they are trained),
precision, XLA, steps per execution, and the shuffle buffer down to a floor (`shuffle_floor`).
The batch size only when asked (`batch=True`), and then the learning rate moves with it
(linear scaling rule). Candidates are listed most promising first. The text task (text_plan)
searches its own pipeline's knobs: reads, parse threads, cache, prefetch, the padding the
length buckets allow (more or fewer bucket shapes), and the same train knobs; the token budget
only when asked, as the batch size.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from train.core.errors import UserError


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


def shuffle_floor(global_batch: int, num_train: int) -> int:
    """The smallest shuffle buffer tune may choose: max(1000, 10 batches), at most the training split.

    A batch is drawn from the buffer only: with a smaller one, neighbouring records (the same
    shard, the order they were written in) land in the same batch and batches stop being a
    fair sample, which changes the gradient noise and so what is learned. Above the floor,
    a smaller buffer only saves memory and the time to refill it at each epoch.
    """
    return min(num_train, max(1000, 10 * global_batch))


def _dedupe(values: list) -> list:
    seen, out = set(), []
    for value in values:
        key = json.dumps(value)
        if key not in seen:
            seen.add(key)
            out.append(value)
    return out


def plan(cfg, spec, found, *, replicas: int = 1, batch: bool = False, only: list[str] = ()) -> list[Knob]:
    """The knobs and their candidates for this config, dataset and machine, in search order.

    `cfg` is the start config as loaded (unresolved). Candidates equal to the current value,
    invalid ones and caches that do not fit are skipped when their turn comes (`vet`).
    """
    if cfg.task == "text":
        return _only(text_plan(cfg, spec, found, batch=batch), only)
    p, t = cfg.pipeline, cfg.train
    cores = max(1, found.cpu_cores)
    shards = max(1, len(spec.train_files))
    tfrecord = p.reader == "tfrecord"
    knobs: list[Knob] = []
    if batch:
        base_batch, base_rate = p.batch_size, t.learning_rate
        knobs.append(
            Knob(
                "pipeline.batch_size",
                [value for value in (2 * base_batch, 4 * base_batch, base_batch // 2) if value >= 1],
                "fewer, larger steps; the learning rate is scaled with it (linear scaling rule)",
                also=lambda value: {"train.learning_rate": base_rate * value / base_batch},
            )
        )
    # The cache first: it decides what runs every epoch, and so what the parallelism after it acts on.
    caches = ["memory"] + (["disk"] if p.cache_dir and tfrecord else []) + (["encoded"] if tfrecord else []) + ["none"]
    if p.random_crop:
        caches = [c for c in caches if c in ("encoded", "none")]
    knobs.append(
        Knob("pipeline.cache", caches, f"what is kept between epochs, within cache_limit_mb ({p.cache_limit_mb})")
    )
    knobs.append(Knob("pipeline.parallel_calls", _dedupe(["auto", cores, 2 * cores]), "decode and augment threads"))
    knobs.append(Knob("pipeline.prefetch", ["auto", 4], "batches prepared ahead of the model"))
    if tfrecord:
        knobs.append(
            Knob(
                "pipeline.parallel_reads",
                _dedupe(["auto", min(cores, shards), min(2 * cores, shards)]),
                "shards read at once",
            )
        )
    if p.augment in ("batched", "device", "per_example"):
        order = ["device", "batched", "per_example"] if found.gpus else ["batched", "device", "per_example"]
        knobs.append(Knob("pipeline.augment", order, "where the same flips and shift run"))
    stored = min(spec.image_shape[:2])
    if tfrecord and p.output_size is not None and p.output_size < stored and not p.random_crop:
        knobs.append(
            Knob(
                "pipeline.scaled_decode",
                [not p.scaled_decode],
                "DCT-scaled JPEG decode then resize: pixels differ slightly from a full decode and resize",
            )
        )
    steps_per_execution, precision, xla = _train_knobs(found)
    knobs += [steps_per_execution, precision]
    knobs.append(Knob("pipeline.max_intra_op_parallelism", [1, 0], "threads one tf.data op may use"))
    knobs.append(Knob("pipeline.private_threadpool_size", _dedupe([cores, 0]), "tf.data's own thread pool"))
    floor = shuffle_floor(p.batch_size * replicas, spec.num_train)
    shuffles = [value for value in (floor, 2 * floor) if value < p.shuffle_buffer]
    if shuffles:
        knobs.append(Knob("pipeline.shuffle_buffer", shuffles, f"never below {floor} (max(1000, 10 batches))"))
    knobs.append(xla)
    return _only(knobs, only)


def _train_knobs(found) -> list[Knob]:
    """steps per execution, precision, XLA: the same for both tasks."""
    if found.gpus:
        tensor_cores = min(found.compute_capabilities) >= (7, 0)
        precisions = (["mixed_float16"] if tensor_cores else []) + ["float32"]
    else:
        # mixed_bfloat16 without bf16 units measured ~7x slower: not worth a trial
        precisions = (["mixed_bfloat16"] if found.cpu_bf16 else []) + ["float32"]
    return [
        Knob("train.steps_per_execution", [16, 4, 1], "steps per host round trip"),
        Knob("train.precision", precisions, "math precision (weights stay float32)"),
        Knob("train.jit_compile", [True, False], "XLA (one compile per bucket shape)"),
    ]


def text_plan(cfg, spec, found, *, batch: bool = False) -> list[Knob]:
    """The text task's knobs (configs/text/): none changes what is learned but the token budget, searched only
    with `batch` and with the learning rate moving with it."""
    p, t = cfg.text.pipeline, cfg.train
    cores = max(1, found.cpu_cores)
    shards = max(1, len(spec.tokens_train))
    knobs: list[Knob] = []
    if batch and p.batching in ("bucket", "pack"):
        base_budget, base_rate = p.token_budget, t.learning_rate
        knobs.append(
            Knob(
                "text.pipeline.token_budget",
                [value for value in (2 * base_budget, base_budget // 2) if value >= spec.max_length],
                "token slots per batch; the learning rate is scaled with it (linear scaling rule)",
                also=lambda value: {"train.learning_rate": base_rate * value / base_budget},
            )
        )
    knobs.append(Knob("text.pipeline.cache", [True, False], "the parsed token ids kept in memory between epochs"))
    if p.reader == "tfrecord":
        knobs.append(Knob("text.pipeline.parallel_calls", _dedupe(["auto", cores, 2 * cores]), "parse threads"))
        knobs.append(
            Knob(
                "text.pipeline.parallel_reads",
                _dedupe(["auto", min(cores, shards), min(2 * cores, shards)]),
                "token shards read at once",
            )
        )
    knobs.append(Knob("text.pipeline.prefetch", ["auto", 4], "batches prepared ahead of the model"))
    if p.batching == "bucket" and p.bucket_lengths == "auto":
        knobs.append(
            Knob(
                "text.pipeline.max_padding",
                [value for value in (p.max_padding / 2, min(2 * p.max_padding, 0.5)) if value != p.max_padding],
                "padding the length buckets may leave: less is more bucket shapes (and XLA compiles), more is fewer",
            )
        )
    return knobs + _train_knobs(found)


def _only(knobs: list[Knob], only) -> list[Knob]:
    if not only:
        return knobs
    unknown = set(only) - {k.key for k in knobs}
    if unknown:
        raise UserError(
            f"--only {', '.join(sorted(unknown))}: not a knob tune searches here. "
            f"Searched: {', '.join(k.key for k in knobs)}."
        )
    return [k for k in knobs if k.key in only]


def get(cfg, key: str):
    """The value of a dotted key (pipeline.cache) in a Config."""
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node
