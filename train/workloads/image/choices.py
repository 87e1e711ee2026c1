"""The image pipeline's `auto`s decided for a dataset and a device: what to cache, where to shuffle, where to
augment, each with its reason. The run's plan (train/training/plan.py) asks for them through the workload and
writes them, with the reasons, into the run's config.yaml.
"""

from __future__ import annotations

import dataclasses

from train.shards.spec import DatasetSpec
from train.workloads.image import pipeline
from train.workloads.image.settings import PipelineConfig


def pipeline_choices(
    knobs: PipelineConfig, spec: DatasetSpec, gpu: bool, num_examples: int | None = None
) -> tuple[PipelineConfig, dict]:
    """`knobs` with what to cache, where to shuffle and where to augment decided for `spec` (sized
    for `num_examples`, by default its training split) and the device; the reason for each `auto`."""
    num_examples = spec.num_train if num_examples is None else num_examples
    reasons = {}
    augment = knobs.augment
    if augment == "auto":
        augment = "device" if gpu else "batched"
        reasons["pipeline.augment"] = (
            "GPU: flips and shift run on the accelerator, at the start of the model"
            if gpu
            else "no GPU: vectorized on the host, one map per batch (the model shares these cores anyway)"
        )
    cache = knobs.cache
    if cache == "auto":
        cache, why = _cache(dataclasses.replace(knobs, augment=augment), spec, num_examples)
        reasons["pipeline.cache"] = cache + ": " + why
    before = knobs.shuffle_before_decode
    if before == "auto":
        before = cache in ("encoded", "none") and knobs.reader == "tfrecord"
        reasons["pipeline.shuffle_before_decode"] = (
            "nothing decoded is cached: shuffle the records, a buffer of JPEG bytes instead of pixels"
            if before
            else f"decoded images are cached ({cache}): shuffle them after the cache"
        )
    return dataclasses.replace(knobs, augment=augment, cache=cache, shuffle_before_decode=bool(before)), reasons


def _cache(knobs: PipelineConfig, spec: DatasetSpec, num_examples: int) -> tuple[str, str]:
    """What to keep between epochs, and why: the first of decoded in memory, decoded on disk,
    encoded in memory that the limit and the knobs allow."""
    decoded = pipeline.cache_size_mb(dataclasses.replace(knobs, cache="memory"), spec, num_examples)
    encoded = pipeline.encoded_size_mb(spec, num_examples)
    limit = knobs.cache_limit_mb
    if knobs.augment == "python":
        return "none", "the generator augments: a cache after it would keep the first epoch's flips and shifts"
    if knobs.reader == "python":
        why = f"the Python generator's decoded images ({decoded:.0f} MB), limit {limit} MB"
        return ("memory" if decoded <= limit else "none"), why
    if knobs.random_crop:
        why = f"random_crop decodes a new window every epoch: encoded records ({encoded:.0f} MB)"
        return ("encoded" if encoded <= limit else "none"), why
    if decoded <= limit:
        return "memory", f"decoded images ({decoded:.0f} MB) fit in cache_limit_mb ({limit})"
    if knobs.cache_dir:
        on_disk = pipeline.decoded_size_mb(spec, knobs, num_examples)  # a snapshot stores no mirrors
        why = f"decoded images exceed cache_limit_mb ({limit}): a {on_disk:.0f} MB snapshot in {knobs.cache_dir}"
        return "disk", why
    if encoded <= limit:
        why = f"decoded images ({decoded:.0f} MB) exceed cache_limit_mb ({limit}); the records ({encoded:.0f} MB) fit"
        return "encoded", why
    return "none", f"neither decoded ({decoded:.0f} MB) nor encoded ({encoded:.0f} MB) fit in {limit} MB"
