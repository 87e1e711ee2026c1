"""The rules between a config's values that types alone cannot say: ranges, and knobs that need each other.

config.py types every knob; this module checks what those types allow but a run cannot use (a batch of 0,
a disk cache without a folder, a random crop under a decoded cache). All problems of a config are found
and said together, each naming the key, its value and what it must be.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from train.core.errors import UserError

if TYPE_CHECKING:
    from train.config import Config, DataConfig, PipelineConfig, TrainConfig

# pipeline.transforms: what augmentation may do (train/input/augment.py), and the default, right for photos
TRANSFORMS = ("flip_left_right", "flip_up_down", "shift")
PHOTO_TRANSFORMS = ("flip_left_right", "shift")


class _Problems(list):
    """Range and consistency problems of a config, one sentence each."""

    def need(self, ok: bool, key: str, value: Any, rule: str) -> None:
        if not ok:
            self.append(f"'{key}' is {value!r} but must be {rule}")


def check_ranges(cfg: Config, source: str) -> None:
    """Every range and consistency rule; all problems found, raised as one UserError."""
    problems = _Problems()
    _check_data(cfg.data, problems.need)
    _check_pipeline(cfg.pipeline, problems.need)
    _check_train(cfg.train, problems.need)
    _check_run(cfg, problems.need)
    if problems:
        raise UserError(f"{source}: " + "; ".join(problems) + ". Fix the value(s) and run again.")


def _check_data(d: DataConfig, need) -> None:
    need(d.image_size >= 8, "data.image_size", d.image_size, ">= 8")
    need(d.num_train >= 1, "data.num_train", d.num_train, ">= 1")
    need(d.num_val >= 1, "data.num_val", d.num_val, ">= 1")
    need(d.num_shards >= 1, "data.num_shards", d.num_shards, ">= 1")
    need(0 < d.val_fraction < 1, "data.val_fraction", d.val_fraction, "between 0 and 1")
    if d.source == "synthetic":
        need(
            d.num_shards <= min(d.num_train, d.num_val),
            "data.num_shards",
            d.num_shards,
            f"at most the number of examples in the smallest split ({min(d.num_train, d.num_val)})",
        )


def _check_pipeline(p: PipelineConfig, need) -> None:
    need(p.batch_size >= 1, "pipeline.batch_size", p.batch_size, ">= 1")
    unknown = [name for name in p.transforms if name not in TRANSFORMS]
    need(not unknown, "pipeline.transforms", p.transforms, f"a list of {', '.join(TRANSFORMS)} (not {unknown})")
    need(len(set(p.transforms)) == len(p.transforms), "pipeline.transforms", p.transforms, "without repeats")
    for key in ("parallel_reads", "parallel_calls"):
        value = getattr(p, key)
        need(value == "auto" or value >= 1, f"pipeline.{key}", value, "'auto' or >= 1")
    need(p.prefetch == "auto" or p.prefetch >= 0, "pipeline.prefetch", p.prefetch, "'auto' or >= 0")
    need(p.shuffle_buffer >= 0, "pipeline.shuffle_buffer", p.shuffle_buffer, ">= 0")
    need(p.cache_limit_mb >= 0, "pipeline.cache_limit_mb", p.cache_limit_mb, ">= 0")
    need(p.output_size is None or p.output_size >= 8, "pipeline.output_size", p.output_size, "null or >= 8")
    need(
        p.cache != "disk" or bool(p.cache_dir),
        "pipeline.cache_dir",
        p.cache_dir,
        "a local folder when pipeline.cache is 'disk'",
    )
    need(
        not p.random_crop or p.cache in ("auto", "encoded", "none"),
        "pipeline.cache",
        p.cache,
        "'auto', 'encoded' or 'none' with pipeline.random_crop (a decoded cache would keep the first crops)",
    )
    need(
        p.augment != "python" or p.cache in ("auto", "none"),
        "pipeline.cache",
        p.cache,
        "'auto' or 'none' with pipeline.augment 'python' (a cache after the generator would keep the first "
        "epoch's flips and shifts)",
    )
    need(
        not p.random_crop or p.shuffle_buffer > 0,
        "pipeline.shuffle_buffer",
        p.shuffle_buffer,
        "> 0 with pipeline.random_crop (crops are drawn per position in the stream: without a shuffle each "
        "example would get the same crop every epoch)",
    )
    for key in ("random_crop", "scaled_decode"):
        need(
            not getattr(p, key) or p.reader == "tfrecord",
            f"pipeline.{key}",
            getattr(p, key),
            "false unless pipeline.reader is 'tfrecord'",
        )
    need(
        p.shuffle_before_decode is not True or p.reader == "tfrecord",
        "pipeline.shuffle_before_decode",
        p.shuffle_before_decode,
        "'auto' or false unless pipeline.reader is 'tfrecord'",
    )
    need(
        p.cache not in ("encoded", "disk") or p.reader == "tfrecord",
        "pipeline.cache",
        p.cache,
        "'memory', 'auto' or 'none' unless pipeline.reader is 'tfrecord'",
    )
    need(p.private_threadpool_size >= 0, "pipeline.private_threadpool_size", p.private_threadpool_size, ">= 0")
    need(p.max_intra_op_parallelism >= 0, "pipeline.max_intra_op_parallelism", p.max_intra_op_parallelism, ">= 0")
    need(
        p.augment != "python" or p.reader == "python",
        "pipeline.augment",
        p.augment,
        "'none', 'per_example' or 'batched' unless pipeline.reader is 'python' "
        "(numpy augmentation runs in the generator)",
    )
    need(
        p.data_service is None or p.data_service.startswith("grpc://"),
        "pipeline.data_service",
        p.data_service,
        "null or an address like grpc://localhost:5050",
    )
    need(
        p.data_service is None or p.reader == "tfrecord",
        "pipeline.reader",
        p.reader,
        "'tfrecord' when pipeline.data_service is set (a Python generator cannot run on service workers)",
    )


def _check_train(t: TrainConfig, need) -> None:
    need(t.epochs >= 1, "train.epochs", t.epochs, ">= 1")
    need(t.learning_rate > 0, "train.learning_rate", t.learning_rate, "> 0")
    need(
        t.steps_per_epoch is None or t.steps_per_epoch >= 1, "train.steps_per_epoch", t.steps_per_epoch, "null or >= 1"
    )
    need(t.warmup_steps == "auto" or t.warmup_steps >= 0, "train.warmup_steps", t.warmup_steps, "'auto' or >= 0")
    need(
        t.steps_per_execution == "auto" or t.steps_per_execution >= 1,
        "train.steps_per_execution",
        t.steps_per_execution,
        "'auto' or >= 1",
    )
    need(t.cpu_replicas >= 1, "train.cpu_replicas", t.cpu_replicas, ">= 1")
    need(t.collective_timeout_s > 0, "train.collective_timeout_s", t.collective_timeout_s, "> 0")
    need(
        t.stall_timeout_s == "auto" or t.stall_timeout_s >= 0,
        "train.stall_timeout_s",
        t.stall_timeout_s,
        "'auto' or >= 0",
    )


def _check_run(cfg: Config, need) -> None:
    need(cfg.checkpoint.every_epochs >= 1, "checkpoint.every_epochs", cfg.checkpoint.every_epochs, ">= 1")
    need(cfg.checkpoint.every_steps >= 0, "checkpoint.every_steps", cfg.checkpoint.every_steps, ">= 0")
    need(cfg.checkpoint.keep >= 1, "checkpoint.keep", cfg.checkpoint.keep, ">= 1")
    need(cfg.profile.start_step >= 0, "profile.start_step", cfg.profile.start_step, ">= 0")
    need(cfg.profile.num_steps >= 1, "profile.num_steps", cfg.profile.num_steps, ">= 1")
    need(cfg.monitor.interval_s > 0, "monitor.interval_s", cfg.monitor.interval_s, "> 0")
    need(
        bool(cfg.name) and "/" not in cfg.name and cfg.name not in (".", ".."),
        "name",
        cfg.name,
        "a non-empty folder name without '/'",
    )
