"""The tokenizer: Keras `TextVectorization` (lowercase, strip ASCII punctuation, split on whitespace,
integer ids, no fixed length), its vocabulary saved with the dataset, and the same mapping in Python.

Ids: 0 is padding, 1 is out of vocabulary, 2.. are the terms of the vocabulary file in order (most
frequent first). The file holds one term per line, without the two reserved ones.

`PythonTokenizer` is what the naive pipeline runs per example (a split and a dict lookup against the
saved vocabulary). It gives exactly the layer's ids: TensorFlow's `strings.lower` lowercases ASCII
letters only, its punctuation class is Python's `string.punctuation`, and `strings.split` splits on
ASCII whitespace, which is what `bytes.translate` and `bytes.split` do.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from pathlib import Path

from train.core import files

PADDING, OUT_OF_VOCABULARY = "", "[UNK]"
RESERVED = 2  # ids below this are not terms of the vocabulary file


def vectorizer(vocabulary: list[str] | None = None, max_tokens: int | None = None, ragged: bool = True):
    """The TextVectorization layer of the text workload; `vocabulary` is a saved one (with or without the
    two reserved entries), else adapt() the layer on the training texts."""
    import keras

    return keras.layers.TextVectorization(
        max_tokens=max_tokens,
        standardize="lower_and_strip_punctuation",
        split="whitespace",
        output_mode="int",
        vocabulary=_terms(vocabulary) if vocabulary is not None else None,
        ragged=ragged,
    )


def _terms(vocabulary: list[str]) -> list[str]:
    return list(vocabulary[RESERVED:]) if list(vocabulary[:RESERVED]) == [PADDING, OUT_OF_VOCABULARY] else vocabulary


def adapt(texts: Iterable[str], max_tokens: int, batch_size: int = 1024) -> list[str]:
    """The vocabulary (reserved entries first) of at most `max_tokens` ids, learned from `texts`."""
    import tensorflow as tf

    layer = vectorizer(max_tokens=max_tokens)
    dataset = tf.data.Dataset.from_generator(lambda: iter(texts), output_signature=tf.TensorSpec([], tf.string))
    layer.adapt(dataset.batch(batch_size))
    return [str(term) for term in layer.get_vocabulary()]


def save_vocabulary(path: Path, vocabulary: list[str]) -> None:
    files.write_text(path, "".join(term + "\n" for term in _terms(vocabulary)))


def load_vocabulary(path: Path) -> list[str]:
    """The saved vocabulary with the reserved entries in front: the list index is the token id."""
    terms = Path(path).read_text(encoding="utf-8").split("\n")[:-1]
    return [PADDING, OUT_OF_VOCABULARY, *terms]


_LOWER = bytes.maketrans(string.ascii_uppercase.encode(), string.ascii_lowercase.encode())
_PUNCTUATION = string.punctuation.encode()


class PythonTokenizer:
    """text -> token ids in plain Python, the way a first pipeline does it; the same ids as `vectorizer`."""

    def __init__(self, vocabulary: list[str]):
        self.ids = {term.encode(): index for index, term in enumerate(vocabulary) if index >= RESERVED}

    def __call__(self, text: str) -> list[int]:
        words = text.encode("utf-8").translate(_LOWER, _PUNCTUATION).split()
        return [self.ids.get(word, 1) for word in words]
