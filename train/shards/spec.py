"""What the pipeline and the model know about a built dataset, read from its TFDS metadata.

Whatever the source, a built dataset is a folder that `tfds.builder_from_directory` reads:
`dataset_info.json` plus TFRecord shards of `{"image": encoded bytes, "label": int64}`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from train.core.errors import UserError


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What the pipeline and the model need to know about a built dataset."""

    name: str
    root: Path
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]
    num_train: int
    num_val: int
    class_names: tuple[str, ...]
    image_shape: tuple[int, int, int]
    encoding: str  # jpeg or png
    shard_lengths: tuple[tuple[str, int], ...] = ()  # (file, number of records) from the dataset's metadata

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def is_built(directory: Path) -> bool:
    return (directory / "dataset_info.json").is_file()


def read_spec(directory: Path) -> DatasetSpec:
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(os.fspath(directory))
    info = builder.info
    image, label = info.features["image"], info.features["label"]
    if "validation" in info.splits:
        val_split = "validation"
    elif "test" in info.splits:
        val_split = "test"
    else:
        raise UserError(f"Dataset in {directory} has no 'validation' or 'test' split; its splits: {list(info.splits)}.")
    train, val = info.splits["train"], info.splits[val_split]
    return DatasetSpec(
        name=info.name,
        root=directory,
        train_files=tuple(os.fspath(p) for p in train.filepaths),
        val_files=tuple(os.fspath(p) for p in val.filepaths),
        num_train=train.num_examples,
        num_val=val.num_examples,
        class_names=tuple(label.names),
        image_shape=tuple(image.shape),
        encoding=image.encoding_format or "png",  # TFDS stores images as PNG unless told otherwise
        shard_lengths=tuple(
            (os.fspath(path), int(length))
            for split in (train, val)
            for path, length in zip(split.filepaths, split.shard_lengths)
        ),
    )
