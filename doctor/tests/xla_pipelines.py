"""Text pipelines of the corpus, with and without XLA: sequences of varying length into a small classifier.

Plain tf.data + Keras, as a user writes a text classifier (an embedding averaged over the sequence,
two dense layers), fed token sequences of log-normal lengths (median 64, cut at 511). The step is
compiled with XLA (`jit_compile=True`, Keras's default where a GPU is present) or not:

- bucketed: `bucket_by_sequence_length(..., pad_to_bucket_boundary=True, drop_remainder=True)`, four
  shapes, each compiled once in the first steps; prefetched. Nothing planted: under XLA its steps
  must read as the steady state, not as overhead.
- padded: `padded_batch` to the longest sequence of each batch, a new shape nearly every batch;
  prefetched. Under XLA every such batch compiles the step again: the planted cause (recompilation).

The files of the image corpus (user_pipelines.make_files) are not read: the sequences are made
here, the same on every call. user_pipelines.py adds these cases to its own.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

VOCAB, BATCH, SEQUENCES, LONGEST = 2000, 32, 4096, 511
BOUNDARIES = [33, 65, 129, LONGEST + 1]  # padded to 32, 64, 128 and 511: four shapes


def sequences() -> tf.data.Dataset:
    """(tokens, label) pairs of log-normal lengths, trimmed from rows stored padded to LONGEST, cached."""
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(64), 0.7, SEQUENCES), 4, LONGEST).astype(np.int64)
    rows = np.zeros((SEQUENCES, LONGEST), np.int32)
    for i, length in enumerate(lengths):
        rows[i, :length] = rng.integers(1, VOCAB, length)
    labels = (lengths % 2).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((rows, lengths, labels))
    ds = ds.map(lambda row, length, label: (row[:length], label), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.cache().shuffle(SEQUENCES, seed=0).repeat()


def classifier(jit_compile: bool):
    model = keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(VOCAB, 64),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile("sgd", keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=jit_compile)
    return model


def bucketed(batch: int = BATCH) -> tf.data.Dataset:
    ds = sequences().bucket_by_sequence_length(
        lambda tokens, label: tf.shape(tokens)[0],
        bucket_boundaries=BOUNDARIES,
        bucket_batch_sizes=[batch] * (len(BOUNDARIES) + 1),
        pad_to_bucket_boundary=True,
        drop_remainder=True,
    )
    return ds.prefetch(tf.data.AUTOTUNE)


def padded() -> tf.data.Dataset:
    return sequences().padded_batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def text_bucketed_xla(files):
    """Bucketed to four fixed shapes, the step compiled with XLA: four compiles, then the steady state."""
    return bucketed(), classifier(jit_compile=True), {"steps_per_epoch": 20}


def text_padded_xla(files):
    """Padded to the longest of each batch, the step compiled with XLA: a compile for nearly every batch."""
    return padded(), classifier(jit_compile=True), {"steps_per_epoch": 20}


def text_bucketed_xla_large_batch(files):
    """The bucketed pipeline in batches of 256 (small-batch's fix): what a larger batch gains, measured."""
    return bucketed(batch=256), classifier(jit_compile=True), {"steps_per_epoch": 20}


def text_bucketed(files):
    return bucketed(), classifier(jit_compile=False), {"steps_per_epoch": 20}


def text_padded(files):
    return padded(), classifier(jit_compile=False), {"steps_per_epoch": 20}


# Not recorded in corpus_expectations.yaml: whether the pipeline keeps up with batches of 256 is the machine's speed
# at bucketing against the model's (input-bound here); its own test (test_diagnose_corpus.py) measures from it what
# a larger batch does not grow.
NOT_RECORDED = {"text_bucketed_xla_large_batch"}
CASES = {
    "text_bucketed_xla": text_bucketed_xla,
    "text_padded_xla": text_padded_xla,
    "text_bucketed_xla_large_batch": text_bucketed_xla_large_batch,
    "text_bucketed": text_bucketed,
    "text_padded": text_padded,
}
