"""Records tests/data/input_bound.xplane.pb.gz: the profile the Diagnose tab's fast tests serve.

A real capture keeps those tests honest about what diagnose reads, and a stored one keeps them
fast (recording needs TensorFlow: 10-20 s here). Recorded with tensorflow-cpu 2.21 and Keras 3:
a pipeline whose Python function sleeps 4 ms per element, no prefetch, batches of 4, six marked
steps (StepTraceProfiler), so diagnose calls it input-bound. Record it again with
`cd doctor && python -m tests.record_tab_profile` after a profiler upgrade that changes the format.
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
import time
from pathlib import Path

FIXTURE = Path(__file__).parent / "data" / "input_bound.xplane.pb.gz"


def record(out: Path = FIXTURE) -> Path:
    import keras
    import numpy as np
    import tensorflow as tf

    from step_doctor.callbacks import StepTraceProfiler

    def sleepy(index):
        time.sleep(0.004)
        return np.zeros((8, 8, 3), np.uint8), np.int64(index % 2)

    def load(index):
        image, label = tf.numpy_function(sleepy, [index], (tf.uint8, tf.int64))
        image.set_shape((8, 8, 3))
        label.set_shape(())
        return image, label

    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    dataset = tf.data.Dataset.range(1_000).map(load).batch(4).with_options(options)
    inputs = keras.Input(shape=(8, 8, 3), dtype="uint8")
    x = keras.layers.Conv2D(4, 3, strides=2, activation="relu")(keras.layers.Rescaling(1.0 / 255)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GlobalMaxPooling2D()(x)))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with tempfile.TemporaryDirectory() as folder:
        callback = StepTraceProfiler(Path(folder) / "run", start_step=2, num_steps=6)
        model.fit(dataset, steps_per_epoch=10, epochs=1, verbose=0, callbacks=[callback])
        (xplane,) = Path(folder).rglob("*.xplane.pb")
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(xplane, "rb") as source, gzip.open(out, "wb", compresslevel=9) as target:
            shutil.copyfileobj(source, target)
    return out


if __name__ == "__main__":
    print(f"{record()}: {FIXTURE.stat().st_size:,} bytes")
