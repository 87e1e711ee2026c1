"""Converting other image collections into the template's sharded TFRecords.

Sources that are not built by a tensorflow-datasets builder of their own (a folder of
images, a TFDS dataset by name) are converted here into the same layout: square JPEG
images of `data.image_size` (center-cropped, then resized), int64 labels, N shards per
split, and TFDS metadata written with `tfds.folder_dataset.write_metadata`, so the result
is read exactly like the built-in dataset.

Writing is atomic and resumable: shards go into a `partial.*` folder next to the
target, each shard written as `.tmp` and renamed when complete; a rerun after an
interruption keeps the finished shards, and the folder is renamed into place only when
every shard and the metadata are there.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

JPEG_QUALITY = 90


def square_jpeg(image: Image.Image, size: int) -> bytes:
    """Center-crop to a square, resize to `size`, encode as JPEG."""
    image = image.convert("RGB")
    width, height = image.size
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    image = image.crop((left, top, left + side, top + side))
    if side != size:
        image = image.resize((size, size), Image.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def serialize(jpeg: bytes, label: int) -> bytes:
    from tensorflow.core.example import example_pb2, feature_pb2

    example = example_pb2.Example(
        features=feature_pb2.Features(
            feature={
                "image": feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[jpeg])),
                "label": feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[label])),
            }
        )
    )
    return example.SerializeToString()


class DatasetWriter:
    """Writes shards into a staging folder and publishes the dataset in one rename."""

    def __init__(self, target: Path, name: str):
        self.target = Path(target)
        self.name = name
        self.staging = self.target.parent / f"partial.{self.target.name}"  # kept across interruptions
        self.staging.mkdir(parents=True, exist_ok=True)
        for leftover in self.staging.glob("*.tmp"):
            leftover.unlink()

    def shard_path(self, split: str, index: int, count: int) -> Path:
        return self.staging / f"{self.name}-{split}.tfrecord-{index:05d}-of-{count:05d}"

    def done(self, split: str, index: int, count: int) -> bool:
        return self.shard_path(split, index, count).exists()

    def write_shard(self, split: str, index: int, count: int, payloads: Iterable[bytes]) -> int:
        import tensorflow as tf

        final = self.shard_path(split, index, count)
        tmp = final.with_name(final.name + ".tmp")
        written = 0
        with tf.io.TFRecordWriter(str(tmp)) as writer:
            for payload in payloads:
                writer.write(payload)
                written += 1
        os.replace(tmp, final)
        return written

    def finish(self, class_names: Sequence[str], image_size: int, description: str) -> None:
        import tensorflow_datasets as tfds

        features = tfds.features.FeaturesDict(
            {
                "image": tfds.features.Image(shape=(image_size, image_size, 3), encoding_format="jpeg"),
                "label": tfds.features.ClassLabel(names=list(class_names)),
            }
        )
        tfds.folder_dataset.write_metadata(
            data_dir=str(self.staging),
            features=features,
            description=description,
            filename_template="{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
            supervised_keys=("image", "label"),
            check_data=False,
        )
        if self.target.exists():
            shutil.rmtree(self.target)
        os.replace(self.staging, self.target)


def progress(total: int, description: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=description, unit=" images", mininterval=0.5)


def _encode_file(job: tuple[str, int]) -> tuple[bytes | None, str]:
    """Runs in a worker process (no TensorFlow there): the file as a square JPEG, or why not."""
    path, size = job
    try:
        with Image.open(path) as image:
            return square_jpeg(image, size), ""
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        return None, f"{path}: {error}"


def convert_files(
    writer: DatasetWriter,
    split: str,
    files: Sequence[tuple[str, int]],
    size: int,
    num_shards: int,
    log: Callable[[str], None] = print,
) -> tuple[int, list[str]]:
    """Encode image files in parallel processes into `num_shards` shards; skip unreadable files."""
    from multiprocessing import get_context

    num_shards = max(1, min(num_shards, len(files)))
    written, unreadable = 0, []
    bar = progress(len(files), f"{split}: encoding")
    with get_context("spawn").Pool(max(1, (os.cpu_count() or 2))) as pool:
        for index in range(num_shards):
            shard = files[index::num_shards]
            if writer.done(split, index, num_shards):
                bar.update(len(shard))
                continue
            payloads = []
            encoded = pool.imap(_encode_file, [(path, size) for path, _ in shard], chunksize=16)
            for (_, label), (jpeg, problem) in zip(shard, encoded):
                bar.update(1)
                if jpeg is None:
                    unreadable.append(problem)
                else:
                    payloads.append(serialize(jpeg, label))
            written += writer.write_shard(split, index, num_shards, payloads)
    bar.close()
    return written, unreadable


def convert_examples(
    writer: DatasetWriter,
    split: str,
    examples: Iterable[tuple[np.ndarray, int]],
    size: int,
    num_shards: int,
    total: int | None = None,
) -> int:
    """Encode decoded examples (uint8 HxWxC, label) round-robin into `num_shards` shards."""
    shards: list[list[bytes]] = [[] for _ in range(num_shards)]
    bar = progress(total or 0, f"{split}: encoding")
    count = 0
    for count, (pixels, label) in enumerate(examples, start=1):
        image = Image.fromarray(pixels if pixels.shape[-1] == 3 else np.repeat(pixels[..., :1], 3, axis=-1))
        shards[(count - 1) % num_shards].append(serialize(square_jpeg(image, size), int(label)))
        bar.update(1)
    bar.close()
    for index, payloads in enumerate(shards):
        writer.write_shard(split, index, num_shards, payloads)
    return count
