"""The one input-pipeline builder. Every knob is explicit in `PipelineConfig`.

The naive baseline and the optimized pipeline are presets of these knobs
(configs/naive.yaml, configs/optimized.yaml); the ladder turns them on one at a time.
Stages, in order, each switched by its knob:

    read      python: a generator reads records and decodes JPEGs with PIL, one by one
              tfrecord: shard list (shuffled) -> interleave(TFRecordDataset) -> map(parse+decode)
    mirror    batched augmentation only: each image next to its left-right mirror (made once when cached)
    cache     decoded images in memory, when they fit
    shuffle   element shuffle buffer
    augment   python (in the generator) | per_example (map, before batch)
    batch
    repeat    training only: the iterator lives across epochs, so prefetch spans the boundary
    augment   batched: one vectorized map per batch (a row gather from the mirrored images)
    service   optional: the stages above run on tf.data service workers
    prefetch

Elements are (uint8 images [B, H, W, C], int64 labels [B]).
"""

from __future__ import annotations

import io
import itertools

import numpy as np
import tensorflow as tf

from train.config import PipelineConfig
from train.input import augment, records
from train.sources import DatasetSpec

AUTOTUNE = tf.data.AUTOTUNE

# PIL decodes with libjpeg's accurate integer DCT; asking TensorFlow for the same makes
# both readers produce identical pixels, so the two presets really yield the same examples.
JPEG_DCT_METHOD = "INTEGER_ACCURATE"


def _auto(value: int | str) -> int:
    return AUTOTUNE if value == "auto" else int(value)


def mirrored(knobs: PipelineConfig, training: bool = True) -> bool:
    """Batched augmentation stores each image with its mirror (see augment.add_mirror)."""
    return training and knobs.augment == "batched"


def decoded_size_mb(spec: DatasetSpec, num_examples: int, copies: int = 1) -> float:
    height, width, channels = spec.image_shape
    return copies * num_examples * height * width * channels / 2**20


def cache_size_mb(knobs: PipelineConfig, spec: DatasetSpec, num_examples: int, training: bool = True) -> float:
    return decoded_size_mb(spec, num_examples, copies=2 if mirrored(knobs, training) else 1)


def cache_enabled(knobs: PipelineConfig, spec: DatasetSpec, num_examples: int, training: bool = True) -> bool:
    if knobs.cache == "auto":
        return cache_size_mb(knobs, spec, num_examples, training) <= knobs.cache_limit_mb
    return knobs.cache == "memory"


def decode_image(encoded, spec: DatasetSpec):
    """Bytes -> uint8 [H, W, C] with a static shape."""
    if spec.encoding == "jpeg":
        image = tf.io.decode_jpeg(encoded, channels=spec.image_shape[2], dct_method=JPEG_DCT_METHOD)
    else:
        image = tf.io.decode_image(encoded, channels=spec.image_shape[2], expand_animations=False)
    image.set_shape(spec.image_shape)
    return image


def _python_reader(files, spec: DatasetSpec, knobs: PipelineConfig, training: bool, seed: int) -> tf.data.Dataset:
    """What most first pipelines look like: a Python loop that reads, decodes and augments."""
    from PIL import Image

    epochs = itertools.count()
    python_augment = training and knobs.augment == "python"

    def decode(path: str, index: int, item) -> tuple[np.ndarray, int]:
        if isinstance(item, records.CorruptRecord):
            raise item
        try:
            encoded, label = records.parse_example(item)
            image = np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"))
        except (ValueError, OSError) as error:  # PIL raises OSError subclasses for bad images
            raise records.CorruptRecord(path, index, f"image does not decode ({error})") from None
        if image.shape != spec.image_shape:
            raise records.CorruptRecord(path, index, f"image is {image.shape}, the dataset says {spec.image_shape}")
        return image, label

    def examples():
        rng = np.random.default_rng([seed, next(epochs)])
        order = list(files)
        if training and knobs.shuffle_files:
            rng.shuffle(order)
        for path in order:
            for index, item in records.read_records(path):
                try:
                    image, label = decode(path, index, item)
                except records.CorruptRecord:
                    if knobs.skip_corrupt:
                        continue
                    raise
                if python_augment:
                    image = augment.numpy_augment(image, rng)
                yield image, label

    signature = (
        tf.TensorSpec(shape=spec.image_shape, dtype=tf.uint8),
        tf.TensorSpec(shape=(), dtype=tf.int64),
    )
    return tf.data.Dataset.from_generator(examples, output_signature=signature)


def _tfrecord_reader(
    files, spec: DatasetSpec, knobs: PipelineConfig, training: bool, seed: int, damaged: dict[str, list[bytes]]
) -> tf.data.Dataset:
    """Shard list -> interleaved TFRecord reads -> parallel parse and decode.

    `damaged` holds the readable records of shards with damaged ones (found by a scan when
    pipeline.skip_corrupt is on): TensorFlow's reader stops at the first damaged record of a
    file, so those shards are read from the scan's copy instead.
    """
    damaged_here = [payload for path in files if path in damaged for payload in damaged[path]]
    files = [path for path in files if path not in damaged]
    file_list = tf.data.Dataset.from_tensor_slices(files)
    if training and knobs.shuffle_files:
        file_list = file_list.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    if knobs.parallel_reads == 1:
        serialized = tf.data.TFRecordDataset(file_list)
    else:
        parallel_reads = _auto(knobs.parallel_reads)
        serialized = file_list.interleave(
            tf.data.TFRecordDataset,
            cycle_length=parallel_reads,
            num_parallel_calls=parallel_reads,
            deterministic=knobs.deterministic,
        )
    if damaged_here:
        serialized = serialized.concatenate(tf.data.Dataset.from_tensor_slices(damaged_here))
    spec_features = records.feature_spec()

    def parse_and_decode(payload):
        example = tf.io.parse_single_example(payload, spec_features)
        return decode_image(example["image"], spec), example["label"]

    return serialized.map(
        parse_and_decode, num_parallel_calls=_auto(knobs.parallel_calls), deterministic=knobs.deterministic
    )


def options(knobs: PipelineConfig) -> tf.data.Options:
    opts = tf.data.Options()
    opts.deterministic = knobs.deterministic
    opts.autotune.enabled = knobs.autotune
    # tf.data quietly appends a prefetch when autotuning; "no prefetch" must mean none.
    opts.experimental_optimization.inject_prefetch = knobs.prefetch != 0
    if knobs.private_threadpool_size:
        opts.threading.private_threadpool_size = knobs.private_threadpool_size
    if knobs.max_intra_op_parallelism:
        opts.threading.max_intra_op_parallelism = knobs.max_intra_op_parallelism
    return opts


def build(
    files,
    spec: DatasetSpec,
    knobs: PipelineConfig,
    *,
    training: bool,
    num_examples: int,
    batch_size: int,
    seed: int = 0,
    damaged: dict[str, list[bytes]] | None = None,
) -> tf.data.Dataset:
    """The input pipeline for one split, in batches of `batch_size`.

    `batch_size` is what one dataset element holds: the global batch for a single-process
    run (a strategy splits it between replicas), the per-replica batch inside
    `distribute_datasets_from_function`. The run set-up (training/setup.py) derives it from
    the per-replica `pipeline.batch_size`; nothing here reads that knob.
    `training=False` reads every example once, unshuffled and without augmentation (in file
    order when `pipeline.deterministic`; the optimized preset hands out whichever is ready).
    """
    if knobs.reader == "python":
        dataset = _python_reader(files, spec, knobs, training, seed)
    else:
        dataset = _tfrecord_reader(files, spec, knobs, training, seed, damaged or {})
    parallel_calls = _auto(knobs.parallel_calls)
    if mirrored(knobs, training):
        dataset = dataset.map(augment.add_mirror, num_parallel_calls=parallel_calls, deterministic=knobs.deterministic)
    if cache_enabled(knobs, spec, num_examples, training):
        dataset = dataset.cache()
    if training and knobs.shuffle_buffer:
        dataset = dataset.shuffle(knobs.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if training and knobs.augment == "per_example":
        # Indexed within the epoch; the shuffle gives each position a different example every epoch.
        dataset = dataset.enumerate().map(
            lambda index, example: augment.tf_augment_one(index, example, seed),
            num_parallel_calls=parallel_calls,
            deterministic=knobs.deterministic,
        )
    dataset = dataset.batch(batch_size, drop_remainder=training and knobs.drop_remainder)
    if training:
        dataset = dataset.repeat()
    if training and knobs.augment == "batched":
        # Indexed batches: augmentation draws are stateless functions of (seed, batch index).
        dataset = dataset.enumerate().map(
            lambda index, batch: augment.tf_augment_batch(index, batch, seed),
            num_parallel_calls=parallel_calls,
            deterministic=knobs.deterministic,
        )
    if training:
        if knobs.data_service:
            dataset = to_service(dataset, knobs, job_name=f"train-{seed}")
    if knobs.prefetch:
        dataset = dataset.prefetch(_auto(knobs.prefetch))
    return dataset.with_options(options(knobs))


def to_service(dataset: tf.data.Dataset, knobs: PipelineConfig, job_name: str | None = None) -> tf.data.Dataset:
    """Run everything above on the tf.data service's workers; the trainer receives the elements.

    parallel_epochs: every worker produces the whole dataset (each example once per worker).
    distributed_epoch: the dispatcher splits the shards between the workers (each example
    once in all); consumers of the same job share one stream.
    """
    return dataset.apply(
        tf.data.experimental.service.distribute(
            processing_mode=knobs.data_service_mode,
            service=knobs.data_service,
            job_name=job_name if knobs.data_service_mode == "distributed_epoch" else None,
        )
    )


def steps_per_epoch(num_examples: int, batch_size: int, drop_remainder: bool) -> int:
    steps = num_examples // batch_size if drop_remainder else -(-num_examples // batch_size)
    return max(1, steps)


def describe(knobs: PipelineConfig, spec: DatasetSpec, num_examples: int, batch_size: int) -> str:
    """One line naming the stages this preset turns on, for logs and reports."""
    if knobs.reader == "python":
        stages = ["python generator (PIL decode)"]
    else:
        reads = "sequential reads" if knobs.parallel_reads == 1 else f"interleave({knobs.parallel_reads})"
        stages = [f"tfrecord {reads}", f"map(decode, {knobs.parallel_calls})"]
    if mirrored(knobs):
        stages.append("mirror")
    if cache_enabled(knobs, spec, num_examples):
        stages.append(f"cache ({cache_size_mb(knobs, spec, num_examples):.0f} MB)")
    if knobs.shuffle_buffer:
        stages.append(f"shuffle({knobs.shuffle_buffer})")
    if knobs.augment not in ("none", "batched"):
        stages.append(f"augment[{knobs.augment}]")
    stages.append(f"batch({batch_size})")
    if knobs.augment == "batched":
        stages.append("augment[batched]")
    if knobs.data_service:
        stages.append(f"tf.data service ({knobs.data_service_mode})")
    stages.append(f"prefetch({knobs.prefetch})" if knobs.prefetch else "no prefetch")
    return " -> ".join(stages)
