"""The one image pipeline builder. Every knob is explicit in `PipelineConfig` (settings.py).

The naive baseline and the optimized pipeline are presets of these knobs
(configs/naive.yaml, configs/optimized.yaml); the ladder turns them on one at a time.
Stages, in the order `build` chains them, each switched by its knob:

    read      python: a generator reads the records one by one, decodes each JPEG with PIL (resized
              to output_size) and, with augment: python, augments it with numpy, all in Python
              tfrecord: the shared reader (train/input/reader.py): shard list (shuffled every epoch)
              -> TFRecordDataset, interleaved over parallel_reads shards (1: one shard after another)
    cache     encoded: the records (JPEG bytes) in memory
    shuffle   the records, before decoding (shuffle_before_decode: when nothing decoded is cached)
    decode    tfrecord: parse + decode in a parallel map, at output_size: full decode and resize,
              DCT-scaled decode (scaled_decode), or only a random window (random_crop)
    mirror    augment: batched with a decoded memory cache: each image next to its mirror
    cache     memory: decoded images in RAM; disk: a snapshot of decoded images under cache_dir
    shuffle   decoded elements (when the records were not shuffled before decoding)
    augment   per_example: a map before batch
    batch
    repeat    training only: the iterator lives across epochs, so prefetch spans the boundary
    augment   batched: one vectorized map per batch (a row gather; from the mirror when cached)
    service   training only, optional: the stages above run on tf.data service workers
    prefetch
    options   autotune, thread pools; tf.data injects no prefetch of its own when prefetch is 0
    (augment  device: Keras layers at the start of the model, augment.DeviceAugment)

`build` takes knobs whose `auto`s are decided (what to cache, where to shuffle and augment: the
run's plan decides them for the dataset and the device: choices.py) and raises on one that is not.
`auto` in parallel_reads, parallel_calls and prefetch is tf.data's AUTOTUNE.
Elements are (uint8 images [B, H, W, C], int64 labels [B]).
"""

from __future__ import annotations

import io
import itertools
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from train.core.errors import UserError
from train.input import reader
from train.shards import records
from train.shards.spec import DatasetSpec
from train.workloads.image import augment
from train.workloads.image.settings import PipelineConfig

_auto = reader.parallelism


def image_shape(spec: DatasetSpec, knobs: PipelineConfig) -> tuple[int, int, int]:
    """The shape of the images the pipeline hands to the model."""
    height, width, channels = spec.image_shape
    if knobs.output_size is None:
        return spec.image_shape
    if knobs.output_size > min(height, width):
        raise UserError(
            f"pipeline.output_size {knobs.output_size} is larger than the stored images of {spec.root} "
            f"({height}x{width}). Set it to {min(height, width)} or less (or null to train at the stored size)."
        )
    return (knobs.output_size, knobs.output_size, channels)


def mirrored(knobs: PipelineConfig, training: bool = True) -> bool:
    """Batched left-right flips on decoded images cached in memory store each with its mirror
    (augment.add_mirror): made once, so a flip is a row gather. Without that cache the mirror
    would be made every epoch, twice the work and memory; then the batch is flipped instead."""
    flips = "flip_left_right" in knobs.transforms
    return training and flips and knobs.augment == "batched" and knobs.cache == "memory"


def augments(knobs: PipelineConfig, training: bool, where: str) -> bool:
    """Whether the pipeline augments at `where` (python, per_example, batched): training, and a transform listed."""
    return training and knobs.augment == where and bool(knobs.transforms)


def decoded_size_mb(spec: DatasetSpec, knobs: PipelineConfig, num_examples: int, copies: int = 1) -> float:
    height, width, channels = image_shape(spec, knobs)
    return copies * num_examples * height * width * channels / 2**20


def encoded_size_mb(spec: DatasetSpec, num_examples: int) -> float:
    """The records' size (the training shards' bytes, per example), what an encoded cache holds."""
    total = sum(os.path.getsize(path) for path in spec.train_files)
    return total / max(1, spec.num_train) * num_examples / 2**20


def cache_size_mb(knobs: PipelineConfig, spec: DatasetSpec, num_examples: int, training: bool = True) -> float:
    if knobs.cache == "encoded":
        return encoded_size_mb(spec, num_examples)
    if knobs.cache in ("memory", "disk"):
        return decoded_size_mb(spec, knobs, num_examples, copies=2 if mirrored(knobs, training) else 1)
    return 0.0


def memory_cache_mb(knobs: PipelineConfig, spec: DatasetSpec, num_examples: int, training: bool = True) -> float:
    """What the cache keeps in RAM, the size cache_limit_mb bounds (a disk snapshot keeps nothing there)."""
    return 0.0 if knobs.cache == "disk" else cache_size_mb(knobs, spec, num_examples, training)


# The `auto`s of these knobs are decisions (train/training/plan.py makes them); `build` needs them made.
DECIDED_BY_PLAN = ("cache", "augment", "shuffle_before_decode")


def require_resolved(knobs: PipelineConfig) -> None:
    undecided = [f"pipeline.{key}" for key in DECIDED_BY_PLAN if getattr(knobs, key) == "auto"]
    if undecided:
        raise ValueError(
            f"The input pipeline needs its `auto` knobs decided, but {', '.join(undecided)} "
            f"{'is' if len(undecided) == 1 else 'are'} still 'auto'. Decide them for the dataset and the device "
            "first: train.training.plan.resolve(cfg, devices, spec) for a whole config (what a run's set-up does), "
            "or train.workloads.image.choices.pipeline_choices(knobs, spec, gpu=...) for the pipeline knobs alone."
        )


def shuffles_records(knobs: PipelineConfig) -> bool:
    """Whether the element shuffle runs on the encoded records, before decoding: only when nothing
    decoded is cached, since a shuffle before a decoded cache would freeze the first epoch's order."""
    return knobs.shuffle_before_decode is True and knobs.reader == "tfrecord" and knobs.cache in ("encoded", "none")


def decode_ratio(stored: int, output: int) -> int:
    """The largest DCT scale (1, 2, 4 or 8) that still decodes at least `output` pixels."""
    ratio = 1
    while ratio < 8 and stored // (ratio * 2) >= output:
        ratio *= 2
    return ratio


def decoder(spec: DatasetSpec, knobs: PipelineConfig, training: bool):
    """(encoded bytes, per-element seed) -> uint8 image at `image_shape(spec, knobs)`."""
    shape = image_shape(spec, knobs)
    jpeg = spec.encoding == "jpeg"
    crop = training and knobs.random_crop
    resize = shape != spec.image_shape

    def to_size(image):
        if tuple(image.shape[:2]) != tuple(shape[:2]):
            image = tf.image.resize(image, shape[:2], method="bilinear", antialias=True)
            image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
        return tf.ensure_shape(image, shape)

    def decode(encoded, seed):
        if crop:
            full = tf.io.extract_jpeg_shape(encoded) if jpeg else tf.shape(tf.io.decode_image(encoded, channels=3))
            begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
                full,
                tf.zeros([1, 0, 4]),
                seed=seed,
                area_range=(0.5, 1.0),
                aspect_ratio_range=(0.75, 1.33),
                max_attempts=10,
                use_image_if_no_bounding_boxes=True,
            )
            window = tf.stack([begin[0], begin[1], size[0], size[1]])
            if jpeg:
                image = tf.io.decode_and_crop_jpeg(encoded, window, channels=shape[2])
            else:
                image = tf.image.crop_to_bounding_box(
                    tf.io.decode_image(encoded, channels=shape[2], expand_animations=False), *tf.unstack(window)
                )
            return to_size(image)
        if not resize:
            return records.decode_image(encoded, spec)
        if jpeg and knobs.scaled_decode:
            ratio = decode_ratio(min(spec.image_shape[:2]), shape[0])
            image = tf.io.decode_jpeg(encoded, channels=shape[2], ratio=ratio)
            # libjpeg rounds the scaled size up (a 99 px image at 1/2 is 50 px)
            image.set_shape([-(-spec.image_shape[0] // ratio), -(-spec.image_shape[1] // ratio), shape[2]])
            return to_size(image)
        return to_size(records.decode_image(encoded, spec))

    return decode


def _python_reader(files, spec: DatasetSpec, knobs: PipelineConfig, training: bool, seed: int) -> tf.data.Dataset:
    """What most first pipelines look like: a Python loop that reads, decodes and augments."""
    from PIL import Image

    epochs = itertools.count()
    python_augment = augments(knobs, training, "python")
    transforms = augment.Transforms.of(knobs.transforms)
    shape = image_shape(spec, knobs)

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
        if shape != spec.image_shape:
            image = np.asarray(Image.fromarray(image).resize(shape[1::-1], Image.BILINEAR))
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
                    image = augment.numpy_augment(image, rng, transforms)
                yield image, label

    signature = (
        tf.TensorSpec(shape=shape, dtype=tf.uint8),
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
    serialized = reader.records(files, knobs, training=training, seed=seed)
    if damaged_here:
        serialized = serialized.concatenate(tf.data.Dataset.from_tensor_slices(damaged_here))
    if knobs.cache == "encoded":
        serialized = serialized.cache()
    if training and knobs.shuffle_buffer and shuffles_records(knobs):
        serialized = serialized.shuffle(knobs.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    spec_features = records.feature_spec()
    decode = decoder(spec, knobs, training)

    def parse_and_decode(index, payload):
        example = tf.io.parse_single_example(payload, spec_features)
        # A per-element seed (run seed, position in the stream): random crops are the same in every
        # run and any thread, so resumed runs stay exact.
        return decode(example["image"], augment.element_seed(seed, index)), example["label"]

    return serialized.enumerate().map(
        parse_and_decode, num_parallel_calls=_auto(knobs.parallel_calls), deterministic=knobs.deterministic
    )


def options(knobs: PipelineConfig) -> tf.data.Options:
    return reader.options(knobs, knobs.private_threadpool_size, knobs.max_intra_op_parallelism)


def build(
    files,
    spec: DatasetSpec,
    knobs: PipelineConfig,
    *,
    training: bool,
    batch_size: int,
    seed: int = 0,
    damaged: dict[str, list[bytes]] | None = None,
) -> tf.data.Dataset:
    """The input pipeline for one split, in batches of `batch_size`.

    `batch_size` is what one dataset element holds: the global batch for a single-process
    run (a strategy splits it between replicas), the per-replica batch inside
    `distribute_datasets_from_function`. The run's plan (training/plan.py) derives it from
    the per-replica `pipeline.batch_size`; nothing here reads that knob.
    `training=False` reads every example once, unshuffled and without augmentation (in file
    order when `pipeline.deterministic`; the optimized preset hands out whichever is ready).
    """
    require_resolved(knobs)
    if knobs.reader == "python":
        dataset = _python_reader(files, spec, knobs, training, seed)
    else:
        dataset = _tfrecord_reader(files, spec, knobs, training, seed, damaged or {})
    parallel_calls = _auto(knobs.parallel_calls)
    if mirrored(knobs, training):
        dataset = dataset.map(augment.add_mirror, num_parallel_calls=parallel_calls, deterministic=knobs.deterministic)
    if knobs.cache == "memory":
        dataset = dataset.cache()
    elif knobs.cache == "disk":
        dataset = dataset.snapshot(str(snapshot_dir(knobs, spec, training)), compression=None)
    if training and knobs.shuffle_buffer and not shuffles_records(knobs):
        dataset = dataset.shuffle(knobs.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    transforms = augment.Transforms.of(knobs.transforms)
    if augments(knobs, training, "per_example"):
        # Indexed within the epoch; the shuffle gives each position a different example every epoch.
        dataset = dataset.enumerate().map(
            lambda index, example: augment.tf_augment_one(index, example, seed, transforms),
            num_parallel_calls=parallel_calls,
            deterministic=knobs.deterministic,
        )
    dataset = dataset.batch(batch_size, drop_remainder=training and knobs.drop_remainder)
    if training:
        dataset = dataset.repeat()
    if augments(knobs, training, "batched"):
        # Indexed batches: augmentation draws are stateless functions of (seed, batch index).
        batch_augment = augment.tf_augment_batch if mirrored(knobs, training) else augment.tf_augment_plain_batch
        dataset = dataset.enumerate().map(
            lambda index, batch: batch_augment(index, batch, seed, transforms),
            num_parallel_calls=parallel_calls,
            deterministic=knobs.deterministic,
        )
    if training:
        if knobs.data_service:
            dataset = to_service(dataset, knobs, job_name=f"train-{seed}")
    if knobs.prefetch:
        dataset = dataset.prefetch(_auto(knobs.prefetch))
    return dataset.with_options(options(knobs))


def snapshot_dir(knobs: PipelineConfig, spec: DatasetSpec, training: bool) -> Path:
    """Where cache: disk keeps the decoded images of a split (tf.data keys each pipeline's
    snapshot by its fingerprint below this folder, so a changed pipeline never reads a stale one)."""
    height = image_shape(spec, knobs)[0]
    folder = Path(knobs.cache_dir) / spec.name / spec.root.parent.name / f"{height}px"
    return folder / ("train" if training else "validation")


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
    """One line naming the stages these (resolved) knobs turn on, for logs and reports."""
    require_resolved(knobs)
    shape = image_shape(spec, knobs)
    size = f" at {shape[0]}px" if shape != spec.image_shape else ""
    shuffle = f"shuffle({knobs.shuffle_buffer})" if knobs.shuffle_buffer else None
    if knobs.reader == "python":
        stages = [f"python generator (PIL decode{size})"]
    else:
        reads = "sequential reads" if knobs.parallel_reads == 1 else f"interleave({knobs.parallel_reads})"
        stages = [f"tfrecord {reads}"]
        if knobs.cache == "encoded":
            stages.append(f"cache (encoded, {cache_size_mb(knobs, spec, num_examples):.0f} MB)")
        if shuffle and shuffles_records(knobs):
            stages.append(shuffle + " of records")
        how = "crop window" if knobs.random_crop else "DCT-scaled" if knobs.scaled_decode and size else ""
        stages.append(f"map(decode{size}{', ' + how if how else ''}, {knobs.parallel_calls})")
    if mirrored(knobs):
        stages.append("mirror")
    if knobs.cache == "memory":
        stages.append(f"cache ({cache_size_mb(knobs, spec, num_examples):.0f} MB)")
    elif knobs.cache == "disk":
        stages.append(f"snapshot on disk ({cache_size_mb(knobs, spec, num_examples):.0f} MB)")
    if shuffle and not shuffles_records(knobs):
        stages.append(shuffle)
    listed = ", ".join(knobs.transforms)
    if knobs.transforms and knobs.augment in ("python", "per_example"):
        stages.append(f"augment[{knobs.augment}: {listed}]")
    stages.append(f"batch({batch_size})")
    if knobs.transforms and knobs.augment == "batched":
        stages.append(f"augment[batched: {listed}]")
    if knobs.data_service:
        stages.append(f"tf.data service ({knobs.data_service_mode})")
    stages.append(f"prefetch({knobs.prefetch})" if knobs.prefetch else "no prefetch")
    if knobs.transforms and knobs.augment == "device":
        stages.append(f"augment[device, in the model: {listed}]")
    return " -> ".join(stages)
