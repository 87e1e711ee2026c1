"""The record format every dataset source ends in, read two ways.

A record is a serialized `tf.train.Example` with `image` (encoded JPEG/PNG bytes) and
`label` (int64), framed in TFRecord files: the layout tensorflow-datasets writes for an
`Image` + `ClassLabel` dataset. The optimized pipeline parses it with tf.io inside
tf.data; the naive pipeline reads the same files one record at a time in Python, checking
the same CRCs TensorFlow checks, so neither silently trains on damaged bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import google_crc32c

from train.shards.spec import DatasetSpec

# PIL decodes with libjpeg's accurate integer DCT; asking TensorFlow for the same makes
# both readers produce identical pixels, so the two presets really yield the same examples.
JPEG_DCT_METHOD = "INTEGER_ACCURATE"


class CorruptRecord(ValueError):
    """A record that cannot be read: names the shard, the record index and what is wrong."""

    def __init__(self, path: str, index: int, kind: str, framing_lost: bool = False):
        self.path, self.index, self.kind, self.framing_lost = path, index, kind, framing_lost
        super().__init__(f"{path}: record {index}: {kind}")


def feature_spec():
    import tensorflow as tf

    return {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path: str) -> Iterator[tuple[int, bytes | CorruptRecord]]:
    """(index, payload) for each record of a TFRecord file, or (index, CorruptRecord).

    Each record is: uint64 length, uint32 masked CRC-32C of the length, the data, uint32
    masked CRC-32C of the data (little-endian). A record whose data is damaged is reported
    and reading goes on; where the framing itself is lost (a damaged length, a truncated
    file) the problem is reported and reading stops.
    """
    with open(path, "rb") as handle:
        index = 0
        while True:
            header = handle.read(12)
            if not header:
                return
            if len(header) < 12:
                yield index, CorruptRecord(path, index, "truncated (incomplete length header)", framing_lost=True)
                return
            length, length_crc = struct.unpack("<QI", header)
            if _masked_crc(header[:8]) != length_crc:
                yield (
                    index,
                    CorruptRecord(
                        path, index, "corrupt length field; the rest of the shard is unreadable", framing_lost=True
                    ),
                )
                return
            payload = handle.read(length)
            footer = handle.read(4)
            if len(payload) < length or len(footer) < 4:
                yield (
                    index,
                    CorruptRecord(path, index, f"truncated ({len(payload)} of {length} bytes)", framing_lost=True),
                )
                return
            if _masked_crc(payload) != struct.unpack("<I", footer)[0]:
                yield index, CorruptRecord(path, index, "corrupt data (CRC mismatch)")
            else:
                yield index, payload
            index += 1


def parse_example(payload: bytes) -> tuple[bytes, int]:
    """(encoded image bytes, label) of one serialized tf.train.Example, without TensorFlow ops."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.example import example_pb2

    try:
        features = example_pb2.Example.FromString(payload).features.feature
        return features["image"].bytes_list.value[0], int(features["label"].int64_list.value[0])
    except (DecodeError, IndexError, KeyError) as error:
        raise ValueError(f"not an image/label tf.train.Example ({type(error).__name__})") from None


def decode_image(encoded, spec: DatasetSpec):
    """Bytes -> uint8 [H, W, C] at the stored size, with a static shape."""
    import tensorflow as tf

    if spec.encoding == "jpeg":
        image = tf.io.decode_jpeg(encoded, channels=spec.image_shape[2], dct_method=JPEG_DCT_METHOD)
    else:
        image = tf.io.decode_image(encoded, channels=spec.image_shape[2], expand_animations=False)
    image.set_shape(spec.image_shape)
    return image
