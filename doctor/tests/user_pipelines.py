"""A corpus of small training scripts written the way users write them, one planted cause each.

Plain tf.data + Keras: nothing here imports this project's input pipeline. Each case builds
`(dataset, model)` from files made by `make_files`; `profile` trains it and profiles about ten
steps with the doctor's step-marker callback (what the README teaches), or with the stock
Keras TensorBoard callback. The diagnosis must find each cause in the profile alone: the
tests pass it a log folder, never a case name.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

try:
    from tests import xla_pipelines
except ImportError:  # run as a script (python tests/user_pipelines.py ...): its own folder is on the path
    import xla_pipelines

SIZE = 64  # what the models train on
FULL = 384  # the "camera" size of the JPEG files
CLASSES = 10
START, STEPS = 3, 10  # profile steps START .. START + STEPS + 1 (the callback traces two more)


def make_files(root: Path) -> dict:
    """JPEG files, GZIP TFRecord shards, in-memory arrays and raw text lines, as a user's data would be."""
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
        "texts": xla_pipelines.write_texts(root),
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


# ---- a model matched to this machine, where the planted cause depends on the model's speed against the pipeline's ---
# A missing prefetch costs a step min(batch production, the rest of the step): it shows as a cause only while the
# model's step and the pipeline's batch are of the same order. Machines differ several-fold in how fast they run the
# same model against the same pipeline, so the model's width is chosen here, on the machine that runs the case.

MATCHED = {  # case -> (its pipeline, the model's step / the pipeline's batch it is planted at)
    "no_prefetch": ("_no_prefetch_pipeline", 2.0),
    "parallel_map_no_prefetch_fast_model": ("_batches_mapped_in_parallel", 0.05),  # the narrowest model there is
    "parallel_map_no_prefetch_slow_model": ("_batches_mapped_in_parallel", 4.0),
}
WIDTHS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def strided_model(width: int, input_shape=(SIZE, SIZE, 3)):
    """Two convolutions after a stride of 2: its step spans 1-2 orders of magnitude as `width` grows."""
    model = keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Conv2D(width, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(width, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def batch_ms(dataset, skip: int = 5, count: int = 12) -> float:
    """Milliseconds the pipeline takes per batch by itself, after `skip` batches (buffers filled)."""
    iterator = iter(dataset)
    for _ in range(skip):
        next(iterator)
    started = time.perf_counter()
    for _ in range(count):
        next(iterator)
    return 1e3 * (time.perf_counter() - started) / count


def step_ms(model, batch, steps: int = 12) -> float:
    """The model's training step on one batch fed from memory (median, the first three steps left out)."""
    ended = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda step, logs: ended.append(time.perf_counter()))
    model.fit(tf.data.Dataset.from_tensors(batch).repeat(), steps_per_epoch=steps, verbose=0, callbacks=[record])
    return 1e3 * float(np.median(np.diff(ended[3:])))


def match_width(dataset, ratio: float) -> dict:
    """The strided_model width whose step on this machine is nearest `ratio` times the pipeline's batch, with
    both figures: {"width", "step_ms", "batch_ms", "ratio"}."""
    produced = batch_ms(dataset)
    batch = next(iter(dataset))
    target, measured = ratio * produced, {}

    def measure(index: int) -> float:
        if index not in measured:
            measured[index] = step_ms(strided_model(WIDTHS[index]), batch)
        return measured[index]

    # From width 16, a jump to where the step would be if it grew as width ** 1.5, then one width at a time.
    guess = 16 * (target / measure(WIDTHS.index(16))) ** (1 / 1.5)
    index = int(np.argmin([abs(np.log(w / guess)) for w in WIDTHS]))
    while True:
        step = 1 if measure(index) < target else -1
        if not 0 <= index + step < len(WIDTHS) or index + step in measured:
            break
        index += step
    best = min(measured, key=lambda i: abs(np.log(measured[i] / target)))
    return {
        "width": WIDTHS[best],
        "step_ms": round(measured[best], 2),
        "batch_ms": round(produced, 2),
        "ratio": round(measured[best] / produced, 2),
    }


def matched(files: dict, case: str) -> dict:
    """match_width for `case`'s pipeline, measured once per files (kept in files["matched"]; save_matched writes
    it for scripts)."""
    pipeline, ratio = MATCHED[case]
    found = files.setdefault("matched", {})
    if case not in found:
        found[case] = match_width(globals()[pipeline](files), ratio)
    return found[case]


def matched_model(files: dict, case: str):
    return strided_model(matched(files, case)["width"])


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


def _resized_standardized(image, label, factor: int = 2):
    """Flipped at random, resized from `factor` times the size (bicubic up, antialiased down) and standardized:
    per-example work of a few ms that no cache can keep (it is random); images or whole batches."""
    up = (factor * SIZE, factor * SIZE)
    image = tf.image.random_flip_left_right(tf.image.convert_image_dtype(image, tf.float32))
    image = tf.image.resize(image, up, method="bicubic")
    return tf.image.per_image_standardization(tf.image.resize(image, (SIZE, SIZE), antialias=True)), label


def _standardized_examples(files):
    """In-memory images through a map of two parallel calls, autotune off to keep memory predictable."""
    options = tf.data.Options()
    options.autotune.enabled = False
    ds = tf.data.Dataset.from_tensor_slices((files["images"], files["image_labels"]))
    return ds.repeat().map(_resized_standardized, num_parallel_calls=2).with_options(options)


def _no_prefetch_pipeline(files):
    return _standardized_examples(files).shuffle(256).batch(64)


def no_prefetch(files):
    """Parsed in parallel, shuffled and batched, no prefetch, into a model whose step takes about twice as long as
    the pipeline's batch on this machine (matched_model): the batch is made while the model waits."""
    return _no_prefetch_pipeline(files), matched_model(files, "no_prefetch"), {"steps_per_epoch": 20}


def tiny_batch(files):
    """In memory, cached, parallel and prefetched, but two examples per step."""
    ds = tf.data.Dataset.from_tensor_slices((files["images"], files["image_labels"]))
    ds = ds.cache().shuffle(1024).repeat().batch(2).prefetch(tf.data.AUTOTUNE)
    return ds, small_model(), {"steps_per_epoch": 40}


def many_files_sequential(files):
    """A hundred compressed TFRecord shards read one after another (no interleave). The examples fit in memory, so
    a cache after the parse removes the reads with it and ranks first (prove measured it x7.0 against parallel reads'
    x1.2): a cache above the planted stage counts as naming it (corpus_expectations.first_or_tied)."""
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        image = tf.reshape(tf.io.decode_raw(example["image"], tf.float32), (SIZE, SIZE, 3))
        return tf.cast(image * 255, tf.uint8), example["label"]

    ds = tf.data.TFRecordDataset(files["shards"], compression_type="GZIP", buffer_size=1024)
    ds = ds.repeat().map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(64).prefetch(tf.data.AUTOTUNE)
    return ds, small_model(), {"steps_per_epoch": 20}


def slow_augmentation(files):
    """Per-example random augmentation, parallel and prefetched, slower than the model: random crops of the image
    upscaled to twice its size, colour jitter at that size, resized back."""

    def augment(image, label):
        image = tf.image.convert_image_dtype(image, tf.float32)
        image = tf.image.resize(image, (2 * SIZE, 2 * SIZE), method="bicubic")
        image = tf.image.random_crop(image, (2 * SIZE - 16, 2 * SIZE - 16, 3))
        image = tf.image.random_flip_left_right(image)
        image = tf.image.random_brightness(image, 0.2)
        image = tf.image.random_contrast(image, 0.8, 1.2)
        image = tf.image.random_saturation(image, 0.8, 1.2)
        image = tf.image.random_hue(image, 0.05)
        image = tf.image.resize(image, (SIZE, SIZE), method="bicubic")
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
    from step_doctor.callbacks import StepTraceProfiler

    started = time.perf_counter()
    dataset, model, fit_args = ALL[case](files)
    start = xla_pipelines.PROFILED_FROM.get(case, START)
    if how == "bare":
        model.fit(dataset, verbose=0, **{**fit_args, "epochs": 1, "steps_per_epoch": start})
        tf.profiler.experimental.start(str(logdir))
        model.fit(dataset, verbose=0, **{**fit_args, "epochs": 1, "steps_per_epoch": STEPS + 1})
        tf.profiler.experimental.stop()
        return time.perf_counter() - started
    if how == "stock":
        callback = keras.callbacks.TensorBoard(str(logdir), profile_batch=(start, start + STEPS + 1))
    else:
        callback = StepTraceProfiler(logdir, start_step=start, num_steps=STEPS)
    model.fit(dataset, verbose=0, callbacks=[callback], **fit_args)
    return time.perf_counter() - started


# ---- appended for diagnose's structural fixes: every defect the pipeline tree shows is listed ----------------------


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
    return ds, small_model(), {"steps_per_epoch": 20}


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
    ds = _standardized_examples(files).prefetch(64).shuffle(256).batch(64)
    return ds, matched_model(files, "no_prefetch"), {"steps_per_epoch": 20}


def _batches_mapped_in_parallel(files):
    """Shuffled, batched, then each batch resized and standardized in a map of two parallel calls, the stage the
    model reads from, with no prefetch (autotune off): the map runs ahead by its two calls, nothing buffers more."""
    options = tf.data.Options()
    options.autotune.enabled = False

    def resize(images, labels):
        return _resized_standardized(images, labels, factor=4)

    ds = tf.data.Dataset.from_tensor_slices((files["images"], files["image_labels"])).repeat().shuffle(256).batch(64)
    return ds.map(resize, num_parallel_calls=2).with_options(options)


def parallel_map_no_prefetch_fast_model(files):
    """The pipeline above, feeding a model much faster than it: the model waits for every batch."""
    return (
        _batches_mapped_in_parallel(files),
        matched_model(files, "parallel_map_no_prefetch_fast_model"),
        {"steps_per_epoch": 20},
    )


def parallel_map_no_prefetch_slow_model(files):
    """The same pipeline, feeding a model several times slower than it: it keeps up, and its prefetch is missing."""
    return (
        _batches_mapped_in_parallel(files),
        matched_model(files, "parallel_map_no_prefetch_slow_model"),
        {"steps_per_epoch": 12},
    )


FLIPS = {  # one pipeline against two models: the verdict flips with the model's speed (tests/test_diagnose_corpus.py)
    "parallel_map_no_prefetch_fast_model": parallel_map_no_prefetch_fast_model,
    "parallel_map_no_prefetch_slow_model": parallel_map_no_prefetch_slow_model,
}

STRUCTURAL = {
    "decode_map_no_prefetch": decode_map_no_prefetch,
    "records_one_at_a_time": records_one_at_a_time,
    "prefetch_before_batch": prefetch_before_batch,
}
CASES.update(STRUCTURAL)
ALL.update(STRUCTURAL)
ALL.update(FLIPS)
# text classifiers with and without XLA: fixed shapes, and a new shape nearly every batch (tests/xla_pipelines.py)
CASES.update(xla_pipelines.CASES)
ALL.update(xla_pipelines.CASES)


# ---- custom training loops, and the corpus as scripts a user runs (step-doctor profile -- python ...) ---------
# Run as a script: `python tests/user_pipelines.py CASE FILES_DIR [--steps N] [--times FILE]` trains one case with
# nothing of this project imported and no profiler or step-marker code: what `profile` must capture from outside.


def _pil_examples(files):
    from PIL import Image

    def examples():
        while True:
            for path, label in zip(files["jpegs"], files["labels"]):
                yield np.asarray(Image.open(path).convert("RGB").resize((SIZE, SIZE))), label

    return examples


def _train_step(model, optimizer):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return step


def tape_loop_sequential_map(files, steps=60):
    """A GradientTape step in a tf.function, called from a Python loop; a heavy map without num_parallel_calls."""
    ds, _, _ = sequential_tf_map(files)
    model, optimizer = small_model(), keras.optimizers.Adam()
    train_step = tf.function(_train_step(model, optimizer))
    for step, (images, labels) in enumerate(ds):
        train_step(images, labels)
        if step + 1 >= steps:
            break


def mirrored_loop_generator(files, steps=60):
    """strategy.run over two logical CPUs inside a tf.function; batches from a Python generator (PIL decode)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    signature = (tf.TensorSpec((SIZE, SIZE, 3), tf.uint8), tf.TensorSpec((), tf.int64))
    ds = tf.data.Dataset.from_generator(_pil_examples(files), output_signature=signature).batch(16).prefetch(2)
    with strategy.scope():
        model, optimizer = small_model(), keras.optimizers.Adam()
        optimizer.build(model.trainable_variables)  # its slots made here, not inside the replicated step
    step_fn = _train_step(model, optimizer)

    @tf.function
    def train_step(batch):
        losses = strategy.run(step_fn, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    for step, batch in enumerate(strategy.experimental_distribute_dataset(ds)):
        train_step(batch)
        if step + 1 >= steps:
            break


def own_tensorboard_numpy_function(files, steps=None):
    """model.fit with the user's own TensorBoard(profile_batch=...) callback; PIL decode in tf.numpy_function."""
    ds, model, fit_args = numpy_function_map(files)
    board = keras.callbacks.TensorBoard("tb_logs", profile_batch=(3, 14))
    model.fit(ds, verbose=0, callbacks=[board], **{**fit_args, "steps_per_epoch": steps or fit_args["steps_per_epoch"]})


def _cluster_ports(count: int) -> list[int]:
    """Free ports below the kernel's ephemeral range (as the template's launcher picks them, train/training/launch.py):
    one picked inside it is free for any outgoing connection until the worker binds it, after its TensorFlow import,
    and a worker connecting to a peer not listening yet can be handed that very port."""
    import contextlib
    import random
    import socket

    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ranges.read_text().split()[0]) if ranges.exists() else 0  # elsewhere: bind(0) alone
    ports = []
    with contextlib.ExitStack() as bound:  # each held until all are picked, so bind(0) cannot give one twice
        for port in (random.sample(range(low // 2, low), 200) if low >= 4096 else []) + [0] * count:
            sock = bound.enter_context(socket.socket())
            try:
                sock.bind(("localhost", port))
            except OSError:
                continue
            ports.append(sock.getsockname()[1])
            if len(ports) == count:
                return ports
    raise OSError("no free ports")


def multi_worker_generator(files, steps=40, workers=2):
    """Two local MultiWorkerMirroredStrategy workers (a custom loop: Keras fit fails under MWMS, keras#20585),
    started by this script as a user's launcher would; batches from a Python generator."""
    import os
    import subprocess
    import sys

    if "TF_CONFIG" not in os.environ:
        cluster = {"worker": [f"localhost:{port}" for port in _cluster_ports(workers)]}
        children = []
        for index in range(workers):
            config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            children.append(subprocess.Popen([sys.executable, *sys.argv], env={**os.environ, "TF_CONFIG": config}))
        try:
            codes = [child.wait(timeout=300) for child in children]
            print("workers ended:", *codes, file=sys.stderr, flush=True)  # negative: killed by that signal
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
        raise SystemExit(max(codes))
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    signature = (tf.TensorSpec((SIZE, SIZE, 3), tf.uint8), tf.TensorSpec((), tf.int64))

    def dataset(context):
        ds = tf.data.Dataset.from_generator(_pil_examples(files), output_signature=signature)
        return ds.batch(context.get_per_replica_batch_size(64)).prefetch(2)

    with strategy.scope():
        model, optimizer = small_model(), keras.optimizers.Adam()
        optimizer.build(model.trainable_variables)
    step_fn = _train_step(model, optimizer)

    @tf.function
    def train_step(iterator):
        return strategy.run(step_fn, args=next(iterator))

    iterator = iter(strategy.distribute_datasets_from_function(dataset))
    for _ in range(steps):
        train_step(iterator)


LOOPS = {
    "tape_loop_sequential_map": tape_loop_sequential_map,
    "mirrored_loop_generator": mirrored_loop_generator,
    "own_tensorboard_numpy_function": own_tensorboard_numpy_function,
    "multi_worker_generator": multi_worker_generator,
}


def save_files(root: Path, match=MATCHED) -> Path:
    """make_files once, with its arrays saved beside the files, for scripts that load them (load_files); the
    models of the `match` cases matched to this machine (save_matched)."""
    files = make_files(root)
    np.savez(root / "arrays.npz", images=files["images"], image_labels=files["image_labels"])
    (root / "paths.txt").write_text("\n".join(files["jpegs"] + ["--"] + files["shards"]))
    (root / "matched.json").write_text("{}")
    for case in match:
        save_matched(root, case)
    return root


def save_matched(root: Path, case: str) -> None:
    """Measured here, before a script runs `case`: a script that profile runs must not train anything but its
    case. Each match costs 5-20 s, so a test session matches only the cases it runs."""
    if case not in MATCHED:
        return
    found = json.loads((root / "matched.json").read_text())
    if case not in found:
        files = load_files(root)
        found[case] = matched(files, case)
        (root / "matched.json").write_text(json.dumps(found))


def load_files(root: Path) -> dict:
    jpegs, shards = (part.split("\n") for part in (root / "paths.txt").read_text().split("\n--\n"))
    arrays = np.load(root / "arrays.npz")
    labels = [i % CLASSES for i in range(len(jpegs))]
    matched_widths = json.loads((root / "matched.json").read_text())
    arrays = {name: arrays[name] for name in arrays.files}
    texts = xla_pipelines.write_texts(root)
    return {"jpegs": jpegs, "labels": labels, "shards": shards, "matched": matched_widths, "texts": texts, **arrays}


def run_script(case: str, root: Path, steps: int | None = None, times: str | None = None) -> None:
    """What the script does: train one case, plain Keras or a custom loop, nothing else."""
    files = load_files(root)
    if case in LOOPS:
        LOOPS[case](files, **({"steps": steps} if steps else {}))
        return
    dataset, model, fit_args = ALL[case](files)
    if steps:
        fit_args = {**fit_args, "steps_per_epoch": steps, "epochs": 1}
    callbacks = []
    if times:  # the user's own timing: when each step ended (the overhead benchmark compares these)
        ended = []

        def step_ended(batch, logs):
            ended.append(time.time())

        callbacks.append(keras.callbacks.LambdaCallback(on_train_batch_end=step_ended))
    model.fit(dataset, verbose=0, callbacks=callbacks, **fit_args)
    if times:
        Path(times).write_text(json.dumps({"step_ends": ended, "batch": _batch_size(dataset)}))


def _batch_size(dataset) -> int:
    return int(next(iter(dataset))[0].shape[0])


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="train one corpus case as a user's script would")
    parser.add_argument("case", nargs="?", choices=sorted({*ALL, *LOOPS}))
    parser.add_argument("files", nargs="?", type=Path, help="a folder made by --make-files")
    parser.add_argument("--steps", type=int, help="train this many steps (Keras cases: steps_per_epoch, one epoch)")
    parser.add_argument("--times", help="write when each step ended to this JSON file (Keras cases)")
    parser.add_argument("--make-files", type=Path, metavar="FOLDER", help="make the files the cases read, then exit")
    options = parser.parse_args()
    if options.make_files:
        save_files(options.make_files)
    elif not options.case or not options.files:
        parser.error("give a case and the folder made by --make-files")
    else:
        run_script(options.case, options.files, options.steps, options.times)
