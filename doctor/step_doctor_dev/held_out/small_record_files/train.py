"""Held-out case (step_doctor_dev.bench_held_out): 48 small TFRecord files of JPEGs read one after another, parsed
in a parallel map every epoch. Made for issue 38 after the estimates were; never tuned on."""

import os
import sys

import keras
import numpy as np
import tensorflow as tf

if not os.path.isdir("records"):
    os.makedirs("records")
    rng = np.random.default_rng(3)
    for f in range(48):
        with tf.io.TFRecordWriter(f"records/part-{f:03d}.tfrecord") as writer:
            for _ in range(8):
                pixels = rng.integers(0, 255, (56, 56, 3), dtype=np.uint8)
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "jpeg": tf.train.Feature(
                                bytes_list=tf.train.BytesList(value=[tf.io.encode_jpeg(pixels).numpy()])
                            ),
                            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(rng.integers(0, 4))])),
                        }
                    )
                )
                writer.write(example.SerializeToString())
spec = {"jpeg": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


def parse(record):
    example = tf.io.parse_single_example(record, spec)
    return tf.cast(tf.io.decode_jpeg(example["jpeg"], channels=3), tf.float32) / 255.0, example["label"]


ds = tf.data.TFRecordDataset(sorted(tf.io.gfile.glob("records/*.tfrecord"))).repeat()
ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(32).prefetch(1)
model = keras.Sequential(
    [keras.Input((56, 56, 3)), keras.layers.AveragePooling2D(4), keras.layers.Flatten(), keras.layers.Dense(4)]
)
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(ds, steps_per_epoch=int(sys.argv[1]) if len(sys.argv) > 1 else 80, epochs=1, verbose=0)
