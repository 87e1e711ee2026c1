"""What `make tune` searches for images: the knobs that change speed and not what is learned.

Parallelism, caching, prefetch, thread pools, where augmentation runs, DCT-scaled decoding (a
slightly different resize, only where images are stored larger than they are trained),
precision, XLA, steps per execution, and the shuffle buffer down to a floor (`shuffle_floor`).
The batch size only when asked (`batch=True`), and then the learning rate moves with it
(linear scaling rule). Candidates are listed most promising first.
"""

from __future__ import annotations

from train.core.tuning import Knob, dedupe, shuffle_floor, train_knobs
from train.workloads.image import pipeline


def space(cfg, spec, found, *, replicas: int = 1, batch: bool = False) -> list[Knob]:
    """The knobs and their candidates for this config (as loaded, unresolved), dataset and machine."""
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
    knobs.append(Knob("pipeline.parallel_calls", dedupe(["auto", cores, 2 * cores]), "decode and augment threads"))
    knobs.append(Knob("pipeline.prefetch", ["auto", 4], "batches prepared ahead of the model"))
    if tfrecord:
        knobs.append(
            Knob(
                "pipeline.parallel_reads",
                dedupe(["auto", min(cores, shards), min(2 * cores, shards)]),
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
    steps_per_execution, precision, xla = train_knobs(found)
    knobs += [steps_per_execution, precision]
    knobs.append(Knob("pipeline.max_intra_op_parallelism", [1, 0], "threads one tf.data op may use"))
    knobs.append(Knob("pipeline.private_threadpool_size", dedupe([cores, 0]), "tf.data's own thread pool"))
    floor = shuffle_floor(p.batch_size * replicas, spec.num_train)
    shuffles = [value for value in (floor, 2 * floor) if value < p.shuffle_buffer]
    if shuffles:
        knobs.append(Knob("pipeline.shuffle_buffer", shuffles, f"never below {floor} (max(1000, 10 batches))"))
    knobs.append(xla)
    return knobs


def vet(candidate, best, spec, replicas: int, start) -> str | None:
    """Why a candidate is not worth measuring here (the same once resolved, a cache over the limit, a shuffle
    buffer below the floor), or None. `candidate` and `best` are resolved; `start` is the config tune began at."""
    if (candidate.pipeline, candidate.train) == (best.pipeline, best.train):
        return "the same settings once auto is resolved"
    cache = pipeline.memory_cache_mb(candidate.pipeline, spec, spec.num_train)
    limit = candidate.pipeline.cache_limit_mb
    if cache > limit and cache > pipeline.memory_cache_mb(best.pipeline, spec, spec.num_train):
        return f"its cache ({cache:,.0f} MB) exceeds pipeline.cache_limit_mb ({limit})"
    floor = shuffle_floor(candidate.pipeline.batch_size * replicas, spec.num_train)
    shuffle = candidate.pipeline.shuffle_buffer
    if shuffle and shuffle < min(floor, start.pipeline.shuffle_buffer):
        return f"shuffle buffer {shuffle} below the floor {floor}"
    return None
