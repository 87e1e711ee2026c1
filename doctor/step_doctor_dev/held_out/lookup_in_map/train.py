"""Held-out case (step_doctor_dev.bench_held_out): a numpy_function that sleeps (a stand-in for a lookup in a
key-value store) in a map written without num_parallel_calls. Made for issue 38 after the estimates were; never
tuned on."""

import sys
import time

import keras
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(1)
features = rng.normal(size=(512, 64)).astype("float32")
labels = rng.integers(0, 3, 512)


def fetch(x):
    time.sleep(0.0004)  # a lookup in a key-value store
    return x * 2.0


ds = tf.data.Dataset.from_tensor_slices((features, labels)).repeat()
ds = ds.map(lambda x, y: (tf.numpy_function(fetch, [x], tf.float32), y))
ds = ds.map(lambda x, y: (tf.ensure_shape(x, [64]), y)).batch(32)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(3)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(ds, steps_per_epoch=int(sys.argv[1]) if len(sys.argv) > 1 else 80, epochs=1, verbose=0)
