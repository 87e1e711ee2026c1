"""Text pipelines of the corpus, with and without XLA: sequences of varying length into a small classifier.

Plain tf.data + Keras, as a user writes a text classifier (an embedding averaged over the sequence,
two dense layers), fed token sequences of log-normal lengths (median 64, cut at 511). The step is
compiled with XLA (`jit_compile=True`, Keras's default where a GPU is present) or not:

- bucketed: `bucket_by_sequence_length(..., pad_to_bucket_boundary=True, drop_remainder=True)`, four
  shapes, each compiled once in the first steps; prefetched. Nothing planted: under XLA its steps
  must read as the steady state, not as overhead.
- padded: `padded_batch` to the longest sequence of each batch, a new shape nearly every batch;
  prefetched. Under XLA every such batch compiles the step again: the planted cause (recompilation).
  Without XLA its padded_batch with no bucketing is listed as a structural fix (unbucketed-padding).

And the naive text pipeline as users write it (text_python_tokenization): raw text lines read by a Python
generator that tokenizes each (cleaned character by character as BERT's Python tokenizer does, a dict lookup per
word) and pads it to the maximum length, batches of 64, no prefetch, into a small classifier: the planted cause is
Python tokenization. The same tokenizing inside a map (text_numpy_function_tokenization: tf.numpy_function over
lines tf.data reads, padded_batch to the longest, batches of 64): Python tokenization too, and its padding listed
after it.

The sequences are made here, the same on every call; the raw text lines are written beside the image
corpus's files by write_texts (user_pipelines.make_files calls it). user_pipelines.py adds these cases
to its own.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from pathlib import Path

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


TEXTS, WORDS, MAX_LENGTH = 2048, 5000, 512


def write_texts(root: Path) -> Path:
    """Raw text lines 'label<TAB>text' of pseudo-words from a Zipf vocabulary, log-normal lengths (median 128 words,
    cut at MAX_LENGTH); the label: whether the text holds more of the commonest words than the median text does."""
    path = root / "text" / "lines.txt"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    words = [f"w{i}{'abcdefgh'[i % 8]}" for i in range(WORDS)]
    weights = 1 / np.arange(1, WORDS + 1) ** 1.1
    lengths = np.clip(rng.lognormal(np.log(128), 0.7, TEXTS), 4, MAX_LENGTH).astype(int)
    texts = np.split(rng.choice(WORDS, lengths.sum(), p=weights / weights.sum()), np.cumsum(lengths)[:-1])
    common = np.array([(tokens < 20).mean() for tokens in texts])
    labels = (common > np.median(common)).astype(int)
    lines = [f"{label}\t{' '.join(words[t] for t in tokens).capitalize()}.\n" for label, tokens in zip(labels, texts)]
    path.write_text("".join(lines))
    return path


def _vocabulary(path: Path) -> dict:
    """Word -> id for the VOCAB - 2 commonest words of the texts, counted in Python (0 pads, 1 is unknown)."""
    counts = Counter(w for line in open(path) for w in re.findall(r"\w+", line.split("\t", 1)[1].lower()))
    return {word: i + 2 for i, (word, _) in enumerate(counts.most_common(VOCAB - 2))}


def _cleaned(text: str) -> str:
    """Lower case, accents stripped, punctuation and control characters to spaces, one character at a time: what
    BERT's Python BasicTokenizer does before its word lookup (about 240 us a line here, 6x a regular expression
    and the lookup alone)."""
    out = []
    for char in unicodedata.normalize("NFD", text.lower()):
        category = unicodedata.category(char)
        if category != "Mn":
            out.append(" " if category[0] in "PC" else char)
    return "".join(out)


def text_python_tokenization(files):
    """The naive text pipeline: a Python generator reads the raw lines, tokenizes each in Python (cleaned character
    by character, split, a dict lookup per word), pads to the maximum length; batches of 64, no prefetch."""
    path = files["texts"]
    vocabulary = _vocabulary(path)

    def examples():
        while True:
            with open(path) as lines:
                for line in lines:
                    label, text = line.rstrip("\n").split("\t", 1)
                    ids = [vocabulary.get(word, 1) for word in _cleaned(text).split()][:MAX_LENGTH]
                    yield np.array(ids + [0] * (MAX_LENGTH - len(ids))), int(label)

    signature = (tf.TensorSpec((MAX_LENGTH,), tf.int64), tf.TensorSpec((), tf.int64))
    ds = tf.data.Dataset.from_generator(examples, output_signature=signature).batch(2 * BATCH)
    return ds, tokens_classifier(), {"steps_per_epoch": 20}


def text_numpy_function_tokenization(files):
    """Raw lines read by tf.data, tokenized in Python inside a map (tf.numpy_function, no num_parallel_calls),
    padded_batch of 64 to the longest of each batch (no bucketing), no prefetch."""
    vocabulary = _vocabulary(files["texts"])

    def tokenize(line: bytes):
        words = _cleaned(line.decode().split("\t", 1)[1]).split()
        return np.array([vocabulary.get(word, 1) for word in words][:MAX_LENGTH])

    def parse(line):
        ids = tf.numpy_function(tokenize, [line], tf.int64)
        ids.set_shape([None])
        return ids, tf.strings.to_number(tf.strings.substr(line, 0, 1), tf.int64)

    ds = tf.data.TextLineDataset(str(files["texts"])).repeat().map(parse).padded_batch(2 * BATCH)
    return ds, tokens_classifier(length=None), {"steps_per_epoch": 20}


def tokens_classifier(length: int | None = MAX_LENGTH):
    """A small text classifier: token embeddings averaged, one logit."""
    model = keras.Sequential(
        [
            keras.Input((length,), dtype="int64"),
            keras.layers.Embedding(VOCAB, 16),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )
    model.compile("sgd", keras.losses.BinaryCrossentropy(from_logits=True))
    return model


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
    return bucketed(), classifier(jit_compile=False), {"steps_per_epoch": PROFILED_FROM["text_bucketed"] + 15}


def text_padded(files):
    return padded(), classifier(jit_compile=False), {"steps_per_epoch": 20}


# Not recorded in corpus_expectations.yaml: whether the pipeline keeps up with batches of 256 is the machine's speed
# at bucketing against the model's (input-bound here); its own test (test_diagnose_corpus.py) measures from it what
# a larger batch does not grow.
NOT_RECORDED = {"text_bucketed_xla_large_batch"}
# Cases profiled from a later step than user_pipelines.START: the bucketed pipeline's first steps are its ramp-up
# (each bucket's window filling at its own rate), which on TensorFlow 2.17 read input-bound in 4 of 8 profiles from
# step 3 (waits of 26-41 %) and in 1 of 12 from step 25, 2-core Intel Xeon with AVX512_BF16. That one is real: the
# bucketing runs one window at a time on a core the model's ops share, so the record allows it (corpus_expectations).
# Under XLA (text_bucketed_xla) the first steps stay in the window: its four compiles are what that case is about.
PROFILED_FROM = {"text_bucketed": 25}
CASES = {
    "text_bucketed_xla": text_bucketed_xla,
    "text_padded_xla": text_padded_xla,
    "text_bucketed_xla_large_batch": text_bucketed_xla_large_batch,
    "text_bucketed": text_bucketed,
    "text_padded": text_padded,
    "text_python_tokenization": text_python_tokenization,
    "text_numpy_function_tokenization": text_numpy_function_tokenization,
}
