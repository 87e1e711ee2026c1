"""A corpus of small JAX training scripts, written as users write them, one planted cause each.

Keras 3 on the JAX backend (fed by tf.data or a PyDataset) and plain JAX loops (fed by a Python generator or
from device memory). `record(root)` trains every case in one process and profiles a window of its steps as
`step-doctor profile` would (jax_capture.py): JAX's profiler, with step markers in Keras fit and none in a plain
loop, and TensorFlow's profiler beside it where tf.data feeds the steps, its file moved into JAX's session folder.
`python tests/jax_pipelines.py CASE` trains one case as a user's script, for `step-doctor profile` itself
(`--pause-before-fit S`: a Keras case waits S seconds between building its model and fit).

KERAS_BACKEND must be jax before Keras is imported: this module sets it, so run it in a process of its own.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SIZE, FULL, CLASSES, BATCH = 32, 256, 4, 32
WINDOW = (5, 16)  # the steps a Keras case profiles, as profile's default window


def jpegs(count: int = 128) -> tuple[list[bytes], np.ndarray]:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (FULL // 8, FULL // 8, 3), dtype=np.uint8)
    images = [np.kron(np.roll(base, i, axis=0), np.ones((8, 8, 1), np.uint8)) for i in range(count)]
    return [tf.io.encode_jpeg(image, quality=90).numpy() for image in images], np.arange(count) % CLASSES


def decode(encoded, label):
    image = tf.image.resize(tf.io.decode_jpeg(encoded, channels=3), (SIZE, SIZE)) / 255.0
    return image, label


def small_model():
    model = keras.Sequential(
        [
            keras.Input((SIZE, SIZE, 3)),
            keras.layers.Conv2D(8, 3, strides=2),
            keras.layers.Flatten(),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


# ---- Keras 3 on JAX ------------------------------------------------------------------------------------------------


def keras_tfdata_decode_every_step():
    """JPEGs decoded in a tf.data map on every epoch, no num_parallel_calls, no cache, no prefetch."""
    encoded, labels = jpegs()
    return tf.data.Dataset.from_tensor_slices((encoded, labels)).repeat().map(decode).batch(BATCH), small_model()


def keras_tfdata_fine():
    """The same files decoded once in parallel, cached, shuffled, batched and prefetched."""
    encoded, labels = jpegs()
    ds = tf.data.Dataset.from_tensor_slices((encoded, labels)).map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.cache().repeat().shuffle(128).batch(BATCH).prefetch(tf.data.AUTOTUNE), small_model()


class SlowPyDataset(keras.utils.PyDataset):
    """A PyDataset that decodes and normalises in Python, one image at a time."""

    def __init__(self):
        super().__init__()
        self.encoded, self.labels = jpegs()

    def __len__(self):
        return 10_000

    def __getitem__(self, index):
        rows = [(index * BATCH + i) % len(self.encoded) for i in range(BATCH)]
        images = []
        for row in rows:
            image = tf.io.decode_jpeg(self.encoded[row]).numpy().astype(np.float32)[::5, ::5][:SIZE, :SIZE]
            for channel in range(3):  # per channel, in Python, as scripts often do
                image[..., channel] = (image[..., channel] - image[..., channel].mean()) / 64.0
            images.append(image)
        return np.stack(images), self.labels[rows]


def keras_pydataset_python():
    return SlowPyDataset(), small_model()


KERAS = {
    "keras_tfdata_decode_every_step": keras_tfdata_decode_every_step,
    "keras_tfdata_fine": keras_tfdata_fine,
    "keras_pydataset_python": keras_pydataset_python,
}


class Window(keras.callbacks.Callback):
    """What profile adds to fit on the JAX backend (keras_fit.py, jax_capture.py): its window and step markers."""

    def __init__(self, run: Path, steps=WINDOW):
        super().__init__()
        self.run, self.steps, self.step, self.marker, self.side = run, steps, 0, None, None

    def on_train_batch_begin(self, batch, logs=None):
        if self.step == self.steps[0]:
            start(self.run, with_tensorflow=True, into=self)
        if self.steps[0] <= self.step <= self.steps[1]:
            self.marker = jax.profiler.StepTraceAnnotation("train", step_num=self.step)
            self.marker.__enter__()

    def on_train_batch_end(self, batch, logs=None):
        if self.marker is not None:
            self.marker.__exit__(None, None, None)
            self.marker = None
        if self.step == self.steps[1]:
            stop(self.run, self)
        self.step += 1


def start(run: Path, with_tensorflow: bool, into) -> None:
    import tempfile

    jax.profiler.start_trace(str(run))
    into.side = None
    if with_tensorflow:
        into.side = tempfile.mkdtemp(prefix="jax-corpus-tf-")
        tf.profiler.experimental.start(into.side)


def stop(run: Path, state) -> None:
    from step_doctor.profile.site import jax_capture

    jax.profiler.stop_trace()
    if state.side is not None:
        tf.profiler.experimental.stop()
        jax_capture.JaxCapture._move_tensorflow_file(state.side, str(run))


def train_keras(case: str, run: Path | None, steps: int = 24, pause_s: float = 0.0) -> None:
    data, model = KERAS[case]()
    time.sleep(pause_s)  # a script that does something else between building its model and fit
    callbacks = [Window(run)] if run is not None else []
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks)


# ---- plain JAX loops -----------------------------------------------------------------------------------------------


@jax.jit
def sgd_step(weights, x, y):
    def loss(weights):
        logits = jnp.tanh(x @ weights["w1"]) @ weights["w2"]
        return jnp.mean((logits.squeeze() - y) ** 2)

    value, grads = jax.value_and_grad(loss)(weights)
    return jax.tree_util.tree_map(lambda w, g: w - 0.01 * g, weights, grads), value


def initial_weights(features: int = 256):
    key1, key2 = jax.random.split(jax.random.PRNGKey(0))
    return {"w1": jax.random.normal(key1, (features, 64)) * 0.05, "w2": jax.random.normal(key2, (64, 1)) * 0.05}


def python_batches(rows=lambda step: 256, features: int = 256):
    """A generator that builds each batch in Python: feature engineering in numpy, row by row."""
    rng = np.random.default_rng(0)
    step = 0
    while True:
        raw = rng.normal(size=(rows(step), features)).astype(np.float32)
        for row in raw:  # per row, in Python
            row -= row.mean()
            row /= row.std() + 1e-6
        yield raw, (raw[:, 0] > 0).astype(np.float32)
        step += 1


def jax_loop_python_generator():
    return python_batches()


def jax_loop_shape_churn():
    """Each batch one row longer than the last: the jitted step compiles again every step."""
    return python_batches(rows=lambda step: 64 + step, features=64)


def jax_loop_device_resident():
    """The batches placed on the device once, before training: nothing to wait for."""
    rng = np.random.default_rng(0)
    data = rng.normal(size=(16, 256, 256)).astype(np.float32)
    batches = [(jax.device_put(x), jax.device_put((x[:, 0] > 0).astype(np.float32))) for x in data]

    def cycle():
        step = 0
        while True:
            yield batches[step % len(batches)]
            step += 1

    return cycle()


def grain_normalize(row):
    """A Grain map written in Python: per row, a few NumPy calls."""
    row = row.copy()
    for _ in range(40):
        row = np.tanh(row) * 1.01
    return row


def jax_loop_grain():
    """A Grain dataset whose Python map runs on the training thread (no worker processes, no read threads)."""
    import grain

    raw = np.random.default_rng(0).normal(size=(4096, 256)).astype(np.float32)
    dataset = grain.MapDataset.source(raw).shuffle(seed=0).map(grain_normalize).batch(256).repeat()
    batches = iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))
    return ((x, (x[:, 0] > 0).astype(np.float32)) for x in batches)


LOOPS = {
    "jax_loop_python_generator": jax_loop_python_generator,
    "jax_loop_grain": jax_loop_grain,
    "jax_loop_shape_churn": jax_loop_shape_churn,
    "jax_loop_device_resident": jax_loop_device_resident,
}


def train_loop(case: str, run: Path | None, steps: int = 60, window=(20, 45), marked: bool = False) -> None:
    batches = LOOPS[case]()
    features = 64 if case == "jax_loop_shape_churn" else 256
    weights = initial_weights(features)
    for step in range(steps):
        if run is not None and step == window[0]:
            jax.profiler.start_trace(str(run))
        if marked and run is not None and window[0] <= step <= window[1]:
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                x, y = next(batches)
                weights, loss = sgd_step(weights, x, y)
                loss.block_until_ready()
        else:
            x, y = next(batches)
            weights, loss = sgd_step(weights, x, y)
        if run is not None and step == window[1]:
            loss.block_until_ready()
            jax.profiler.stop_trace()


CASES = {**{name: "keras" for name in KERAS}, **{name: "loop" for name in LOOPS}}


def record(root: Path) -> dict[str, float]:
    """Every case profiled into root/<case> (a marked copy of the generator loop too); seconds each took."""
    took = {}
    for case, kind in CASES.items():
        started = time.perf_counter()
        if kind == "keras":
            train_keras(case, root / case)
        elif case == "jax_loop_shape_churn":  # every step compiles: a shorter window keeps the profile small
            train_loop(case, root / case, steps=24, window=(8, 16))
        else:
            train_loop(case, root / case)
        took[case] = time.perf_counter() - started
    train_loop("jax_loop_python_generator", root / "jax_loop_python_generator_marked", marked=True)
    return took


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--record":
        print(record(Path(sys.argv[2])))
    elif len(sys.argv) in (2, 4) and sys.argv[1] in CASES:  # as a user's script: long enough for profile's windows
        if CASES[sys.argv[1]] == "keras":
            pause = float(sys.argv[3]) if len(sys.argv) == 4 and sys.argv[2] == "--pause-before-fit" else 0.0
            train_keras(sys.argv[1], None, steps=40, pause_s=pause)
        else:
            train_loop(sys.argv[1], None, steps=1000)
    else:
        raise SystemExit(
            f"usage: {sys.argv[0]} CASE [--pause-before-fit SECONDS] | --record ROOT   (cases: {', '.join(CASES)})"
        )
