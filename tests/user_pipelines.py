"""A corpus of small training scripts written the way users write them, one planted cause each.

Plain tf.data + Keras: nothing here imports this project's input pipeline. Each case builds
`(dataset, model)` from files made by `make_files`; `profile` trains it and profiles about ten
steps with the project's step-marker callback (what the README teaches), or with the stock
Keras TensorBoard callback. The diagnosis must find each cause in the profile alone: the
tests pass it a log folder, never a case name.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

SIZE = 64  # what the models train on
FULL = 384  # the "camera" size of the JPEG files
CLASSES = 10
START, STEPS = 3, 10  # profile steps START .. START + STEPS + 1 (the callback traces two more)


def make_files(root: Path) -> dict:
    """JPEG files, GZIP TFRecord shards and in-memory arrays, as a user's data would be."""
    rng = np.random.default_rng(0)
    jpeg_dir = root / "jpeg"
    jpeg_dir.mkdir(parents=True, exist_ok=True)
    paths, labels = [], []
    base = rng.integers(0, 255, (FULL // 8, FULL // 8, 3), dtype=np.uint8)
    for i in range(96):
        image = np.kron(np.roll(base, i, axis=0), np.ones((8, 8, 1), np.uint8))  # blocky, compresses like photos
        path = jpeg_dir / f"img_{i:04d}.jpg"
        path.write_bytes(tf.io.encode_jpeg(image, quality=90).numpy())
        paths.append(str(path))
        labels.append(i % CLASSES)
    shard_dir = root / "tfrecord"
    shard_dir.mkdir(exist_ok=True)
    shards = []
    ramp = np.linspace(0, 1, SIZE, dtype=np.float32)
    for s in range(100):
        path = str(shard_dir / f"part-{s:05d}.tfrecord.gz")
        with tf.io.TFRecordWriter(path, options="GZIP") as writer:
            for j in range(8):  # float32 pixels, as many users store arrays
                noise = rng.normal(0, 0.02, (SIZE, SIZE, 3)).astype(np.float32)
                pixels = (np.add.outer(ramp * (j + 1) / 8, ramp)[..., None] + noise).astype(np.float32)
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[pixels.tobytes()])),
                            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[j % CLASSES])),
                        }
                    )
                )
                writer.write(example.SerializeToString())
        shards.append(path)
    images = rng.integers(0, 255, (2048, SIZE, SIZE, 3), dtype=np.uint8)
    return {
        "jpegs": paths,
        "labels": labels,
        "shards": shards,
        "images": images,
        "image_labels": rng.integers(0, CLASSES, 2048),
    }


def small_model(input_shape=(SIZE, SIZE, 3)):
    model = keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(8, 3, strides=4, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def medium_model(input_shape=(SIZE, SIZE, 3)):
    model = keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


# ---- the cases: each returns (dataset, model, fit keyword arguments) ----------------------------


def generator_python_decode(files):
    """from_generator over a Python loop that decodes JPEGs with PIL."""
    from PIL import Image

    def examples():
        while True:
            for path, label in zip(files["jpegs"], files["labels"]):
                image = Image.open(path).convert("RGB").resize((SIZE, SIZE))
                yield np.asarray(image), label

    ds = tf.data.Dataset.from_generator(
        examples,
        output_signature=(tf.TensorSpec((SIZE, SIZE, 3), tf.uint8), tf.TensorSpec((), tf.int64)),
    )
    ds = ds.batch(16).prefetch(tf.data.AUTOTUNE)
    return ds, small_model(), {"steps_per_epoch": 20}


def numpy_function_map(files):
    """A map that calls tf.numpy_function to decode with PIL."""
    from PIL import Image

    def load(path):
        image = Image.open(io.BytesIO(open(path, "rb").read())).convert("RGB").resize((SIZE, SIZE))
        return np.asarray(image)

    def parse(path, label):
        image = tf.numpy_function(load, [path], tf.uint8)
        image.set_shape((SIZE, SIZE, 3))
        return image, label

    ds = tf.data.Dataset.from_tensor_slices((files["jpegs"], files["labels"]))
    ds = ds.repeat().map(parse).batch(16)
    return ds, small_model(), {"steps_per_epoch": 20}


def sequential_tf_map(files):
    """A map of heavy TensorFlow ops without num_parallel_calls."""

    def preprocess(path, label):
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        image = tf.image.convert_image_dtype(image, tf.float32)
        image = tf.image.resize(image, (2 * SIZE, 2 * SIZE), method="bicubic")
        image = tf.image.sobel_edges(image[None])[0, ..., 0] + image
        image = tf.image.resize(image, (SIZE, SIZE), antialias=True)
        return tf.cast(image * 255, tf.uint8), label

    ds = tf.data.Dataset.from_tensor_slices((files["jpegs"], files["labels"]))
    ds = ds.repeat().map(preprocess).batch(16).prefetch(tf.data.AUTOTUNE)
    return ds, small_model(), {"steps_per_epoch": 20}


def no_prefetch(files):
    """Parsed in parallel, shuffled and batched, no prefetch; autotune off to keep memory predictable."""

    def preprocess(image, label):
        image = tf.image.resize(tf.image.convert_image_dtype(image, tf.float32), (SIZE, SIZE), method="bicubic")
        return tf.image.per_image_standardization(image), label

    options = tf.data.Options()
    options.autotune.enabled = False
    ds = tf.data.Dataset.from_tensor_slices((files["images"], files["image_labels"]))
    ds = ds.repeat().map(preprocess, num_parallel_calls=2).shuffle(256).batch(64).with_options(options)
    return ds, medium_model(), {"steps_per_epoch": 20}


def tiny_batch(files):
    """In memory, cached, parallel and prefetched, but two examples per step."""
    ds = tf.data.Dataset.from_tensor_slices((files["images"], files["image_labels"]))
    ds = ds.cache().shuffle(1024).repeat().batch(2).prefetch(tf.data.AUTOTUNE)
    return ds, small_model(), {"steps_per_epoch": 40}


def many_files_sequential(files):
    """A hundred compressed TFRecord shards read one after another (no interleave)."""
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        image = tf.reshape(tf.io.decode_raw(example["image"], tf.float32), (SIZE, SIZE, 3))
        return tf.cast(image * 255, tf.uint8), example["label"]

    ds = tf.data.TFRecordDataset(files["shards"], compression_type="GZIP", buffer_size=1024)
    ds = ds.repeat().map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(64).prefetch(tf.data.AUTOTUNE)
    return ds, small_model(), {"steps_per_epoch": 20}


def slow_augmentation(files):
    """Per-example random augmentation, parallel and prefetched, slower than the model."""

    def augment(image, label):
        image = tf.image.convert_image_dtype(image, tf.float32)
        image = tf.image.random_flip_left_right(image)
        image = tf.image.random_brightness(image, 0.2)
        image = tf.image.random_contrast(image, 0.8, 1.2)
        image = tf.image.random_saturation(image, 0.8, 1.2)
        image = tf.image.random_hue(image, 0.05)
        image = tf.image.resize(image, (SIZE + 16, SIZE + 16), method="bicubic")
        image = tf.image.random_crop(image, (SIZE, SIZE, 3))
        return tf.cast(tf.clip_by_value(image, 0, 1) * 255, tf.uint8), label

    ds = tf.data.Dataset.from_tensor_slices((files["images"], files["image_labels"]))
    ds = ds.cache().shuffle(1024).repeat().map(augment, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(64).prefetch(tf.data.AUTOTUNE)
    return ds, small_model(), {"steps_per_epoch": 20}


def shuffle_decoded_full_size(files):
    """Decoded full-size images in a shuffle buffer as large as the data set, refilled every epoch."""

    def decode(path, label):
        return tf.io.decode_jpeg(tf.io.read_file(path), channels=3), label

    def resize(image, label):
        return tf.cast(tf.image.resize(image, (SIZE, SIZE)), tf.uint8), label

    ds = tf.data.Dataset.from_tensor_slices((files["jpegs"], files["labels"]))
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE).shuffle(len(files["jpegs"]))
    ds = ds.map(resize, num_parallel_calls=tf.data.AUTOTUNE).batch(24).prefetch(tf.data.AUTOTUNE)
    return ds, small_model(), {"epochs": 5}


def cache_after_augmentation(files):
    """cache() placed after a random augmentation: the first epoch augments, later ones replay it."""

    def augment(image, label):
        image = tf.image.convert_image_dtype(image, tf.float32)
        image = tf.image.random_flip_left_right(image)
        image = tf.image.random_brightness(image, 0.2)
        image = tf.image.random_contrast(image, 0.8, 1.2)
        image = tf.image.random_saturation(image, 0.8, 1.2)  # colour jitter, as most users' augmentation has
        image = tf.image.resize(image, (SIZE + 8, SIZE + 8))
        image = tf.image.random_crop(image, (SIZE, SIZE, 3))
        return tf.cast(tf.clip_by_value(image, 0, 1) * 255, tf.uint8), label

    ds = tf.data.Dataset.from_tensor_slices((files["images"], files["image_labels"]))
    ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE).cache().shuffle(512)
    ds = ds.batch(64).prefetch(tf.data.AUTOTUNE)
    return ds, small_model(), {"epochs": 2}


def already_fine(files):
    """Cached, shuffled, batched, prefetched, feeding a model that has real work to do."""
    model = keras.Sequential(
        [
            keras.Input((SIZE, SIZE, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ds = tf.data.Dataset.from_tensor_slices((files["images"], files["image_labels"]))
    ds = ds.cache().shuffle(1024).repeat().batch(32).prefetch(tf.data.AUTOTUNE)
    return ds, model, {"steps_per_epoch": 20}


CASES = {
    "generator_python_decode": generator_python_decode,
    "numpy_function_map": numpy_function_map,
    "sequential_tf_map": sequential_tf_map,
    "no_prefetch": no_prefetch,
    "tiny_batch": tiny_batch,
    "many_files_sequential": many_files_sequential,
    "slow_augmentation": slow_augmentation,
    "shuffle_decoded_full_size": shuffle_decoded_full_size,
    "cache_after_augmentation": cache_after_augmentation,
    "already_fine": already_fine,
}


# ---- the first recommended fix applied, as a user would apply it ---------------------------------


def numpy_function_map_fixed(files):
    def parse(path, label):
        image = tf.image.resize(tf.io.decode_jpeg(tf.io.read_file(path), channels=3), (SIZE, SIZE))
        return tf.cast(image, tf.uint8), label

    ds = tf.data.Dataset.from_tensor_slices((files["jpegs"], files["labels"]))
    ds = ds.repeat().map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(16)
    return ds, small_model(), {"steps_per_epoch": 20}


def no_prefetch_fixed(files):
    ds, model, fit_args = no_prefetch(files)
    return ds.prefetch(tf.data.AUTOTUNE), model, fit_args


def tiny_batch_fixed(files):
    ds = tf.data.Dataset.from_tensor_slices((files["images"], files["image_labels"]))
    ds = ds.cache().shuffle(1024).repeat().batch(256).prefetch(tf.data.AUTOTUNE)
    return ds, small_model(), {"steps_per_epoch": 20}


def shuffle_decoded_full_size_fixed(files):
    def load(path, label):
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        return tf.cast(tf.image.resize(image, (SIZE, SIZE)), tf.uint8), label

    ds = tf.data.Dataset.from_tensor_slices((files["jpegs"], files["labels"])).shuffle(len(files["jpegs"]))
    ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(24).prefetch(tf.data.AUTOTUNE)
    return ds, small_model(), {"epochs": 5}


FIXED = {
    "numpy_function_map": numpy_function_map_fixed,
    "no_prefetch": no_prefetch_fixed,
    "tiny_batch": tiny_batch_fixed,
    "shuffle_decoded_full_size": shuffle_decoded_full_size_fixed,
}
ALL = {**CASES, **{case + "_fixed": build for case, build in FIXED.items()}}


def profile(case: str, files: dict, logdir: Path, how: str = "markers") -> float:
    """Train `case` and write its profile under logdir; returns the seconds it took.

    how: "markers" (the project's StepTraceProfiler), "stock" (keras.callbacks.TensorBoard with
    profile_batch), or "bare" (tf.profiler.experimental.start/stop around a second fit).
    """
    from train.measure.profiling import StepTraceProfiler

    started = time.perf_counter()
    dataset, model, fit_args = ALL[case](files)
    if how == "bare":
        model.fit(dataset, verbose=0, **{**fit_args, "epochs": 1, "steps_per_epoch": START})
        tf.profiler.experimental.start(str(logdir))
        model.fit(dataset, verbose=0, **{**fit_args, "epochs": 1, "steps_per_epoch": STEPS + 1})
        tf.profiler.experimental.stop()
        return time.perf_counter() - started
    if how == "stock":
        callback = keras.callbacks.TensorBoard(str(logdir), profile_batch=(START, START + STEPS + 1))
    else:
        callback = StepTraceProfiler(logdir, start_step=START, num_steps=STEPS)
    model.fit(dataset, verbose=0, callbacks=[callback], **fit_args)
    return time.perf_counter() - started


# ---- appended for diagnose's structural fixes: every defect the pipeline tree shows is listed ----------------------


def light_model(input_shape=(SIZE, SIZE, 3)):
    model = keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(6, 3, activation="relu"),
            keras.layers.Conv2D(6, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def decode_map_no_prefetch(files):
    """JPEGs decoded and resized in a map written without num_parallel_calls, batched, and no prefetch (autotune
    off): the map holds the step; nothing buffers batches ahead of the model."""

    def load(path, label):
        image = tf.image.resize(tf.io.decode_jpeg(tf.io.read_file(path), channels=3), (SIZE, SIZE))
        return tf.cast(image, tf.uint8), label

    options = tf.data.Options()
    options.autotune.enabled = False
    ds = tf.data.Dataset.from_tensor_slices((files["jpegs"], files["labels"]))
    ds = ds.repeat().map(load).batch(32).with_options(options)
    return ds, light_model(), {"steps_per_epoch": 20}


def records_one_at_a_time(files):
    """GZIP shards read one after another, parsed in a map written without num_parallel_calls, batched, no
    prefetch (autotune off): several defects in one tree, whichever holds the step most."""
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):  # float32 pixels as stored: the map decodes, nothing more
        example = tf.io.parse_single_example(record, spec)
        return tf.reshape(tf.io.decode_raw(example["image"], tf.float32), (SIZE, SIZE, 3)), example["label"]

    options = tf.data.Options()
    options.autotune.enabled = False
    ds = tf.data.TFRecordDataset(files["shards"], compression_type="GZIP")
    ds = ds.repeat().map(parse).batch(64).with_options(options)
    return ds, small_model(), {"steps_per_epoch": 20}


def prefetch_before_batch(files):
    """The no_prefetch pipeline with a prefetch written before .shuffle().batch() (autotune off): elements are
    made ahead, but every batch is still shuffled out and assembled while the model waits."""

    def preprocess(image, label):
        image = tf.image.resize(tf.image.convert_image_dtype(image, tf.float32), (SIZE, SIZE), method="bicubic")
        return tf.image.per_image_standardization(image), label

    options = tf.data.Options()
    options.autotune.enabled = False
    ds = tf.data.Dataset.from_tensor_slices((files["images"], files["image_labels"]))
    ds = ds.repeat().map(preprocess, num_parallel_calls=2).prefetch(64).shuffle(256).batch(64).with_options(options)
    return ds, medium_model(), {"steps_per_epoch": 20}


STRUCTURAL = {
    "decode_map_no_prefetch": decode_map_no_prefetch,
    "records_one_at_a_time": records_one_at_a_time,
    "prefetch_before_batch": prefetch_before_batch,
}
CASES.update(STRUCTURAL)
ALL.update(STRUCTURAL)
