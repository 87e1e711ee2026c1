"""A planted defect for `step-doctor profile --prove` (doctor/tests/test_prove.py, docs/doctor.md): JPEG files decoded
in a map written without num_parallel_calls, every epoch, over data that fits in memory. Run it in a folder of its own:
it writes its images into images/ there on its first run.
"""

import os
import sys

import keras
import numpy as np
import tensorflow as tf

if not os.path.isdir("images"):  # the script's own data, made on its first run
    os.makedirs("images")
    rng = np.random.default_rng(0)
    for i in range(64):
        image = rng.integers(0, 255, (48, 48, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
        tf.io.write_file(f"images/{i:03d}.jpg", tf.io.encode_jpeg(image, quality=90))
paths = sorted(tf.io.gfile.glob("images/*.jpg"))


def load(path):
    image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    return tf.image.resize(image, (32, 32)) / 255.0, tf.strings.length(path) % 4


ds = tf.data.Dataset.from_tensor_slices(paths)
ds = ds.map(load)  # decoded in every epoch, one call at a time
ds = ds.batch(16).repeat()
model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(4)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(ds, steps_per_epoch=int(sys.argv[1]) if len(sys.argv) > 1 else 60, epochs=1, verbose=0)
print("trained")
