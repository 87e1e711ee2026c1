"""The record format every dataset source ends in, read two ways.

A record is a serialized `tf.train.Example` with `image` (encoded JPEG/PNG bytes) and
`label` (int64), framed in TFRecord files: the layout tensorflow-datasets writes for an
`Image` + `ClassLabel` dataset. The optimized pipeline parses it with tf.io inside
tf.data; the naive pipeline reads the same files one record at a time in Python.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

FEATURE_KEYS = ("image", "label")


def feature_spec():
    import tensorflow as tf

    return {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }


def iter_records(path: str) -> Iterator[bytes]:
    """Yield the payload of each record of a TFRecord file, in pure Python.

    Each record is: uint64 length, uint32 CRC of the length, `length` bytes of data,
    uint32 CRC of the data (all little-endian).
    """
    with open(path, "rb") as handle:
        index = 0
        while True:
            header = handle.read(12)
            if not header:
                return
            if len(header) < 12:
                raise ValueError(f"{path}: record {index} is truncated (incomplete length header)")
            (length,) = struct.unpack("<Q", header[:8])
            payload = handle.read(length)
            footer = handle.read(4)
            if len(payload) < length or len(footer) < 4:
                raise ValueError(f"{path}: record {index} is truncated ({len(payload)} of {length} bytes)")
            yield payload
            index += 1


def parse_example(payload: bytes) -> tuple[bytes, int]:
    """(encoded image bytes, label) of one serialized tf.train.Example, without TensorFlow ops."""
    from tensorflow.core.example import example_pb2

    features = example_pb2.Example.FromString(payload).features.feature
    return features["image"].bytes_list.value[0], int(features["label"].int64_list.value[0])
