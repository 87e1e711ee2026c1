"""Token-id records: a `tf.train.Example` with `token_ids` (int64 list, variable length) and `label`
(int64), framed in TFRecord files `<split>.tfrecord-00000-of-0000N`. Written once when the dataset is
built; the optimized pipeline parses them inside tf.data.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path


def serialize(token_ids: Sequence[int], label: int) -> bytes:
    from tensorflow.core.example import example_pb2, feature_pb2

    example = example_pb2.Example(
        features=feature_pb2.Features(
            feature={
                "token_ids": feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=token_ids)),
                "label": feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[label])),
            }
        )
    )
    return example.SerializeToString()


def feature_spec():
    import tensorflow as tf

    return {
        "token_ids": tf.io.FixedLenSequenceFeature([], tf.int64, allow_missing=True),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }


def parse(payload):
    """One serialized record -> (int32 token ids [length], int32 label)."""
    import tensorflow as tf

    example = tf.io.parse_single_example(payload, feature_spec())
    return tf.cast(example["token_ids"], tf.int32), tf.cast(example["label"], tf.int32)


def write_file(path: Path, payloads: Iterable[bytes]) -> int:
    """Write one shard (into a staging folder); returns the number of records."""
    import tensorflow as tf

    count = 0
    with tf.io.TFRecordWriter(str(path)) as writer:
        for payload in payloads:
            writer.write(payload)
            count += 1
    return count
