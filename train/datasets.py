"""Dataset sources: each ends as sharded TFRecords in the tensorflow-datasets layout.

`data.source` names a source as `scheme` or `scheme:argument`. A source knows where its
built dataset lives under `data.data_dir` and how to build it there; `prepare` builds it
once (a no-op when it is already there) and `locate` finds it for training, with a clear
error naming the exact command when it is missing. Whatever the source, the result is a
folder that `tfds.builder_from_directory` reads: `dataset_info.json` plus TFRecord shards
of `{"image": encoded bytes, "label": int64}`, which is all the input pipeline needs.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from train.config import DataConfig
from train.errors import UserError, did_you_mean


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


@dataclasses.dataclass(frozen=True)
class Source:
    """How one scheme of `data.source` is located on disk and built."""

    dataset_dir: Callable[[DataConfig, str], Path]
    prepare: Callable[[DataConfig, str, Path], None]
    describe: str


SOURCES: dict[str, Source] = {}


def register_source(scheme: str, *, describe: str, dataset_dir, prepare) -> None:
    """Register a source for `data.source: scheme[:argument]`.

    `dataset_dir(data_config, argument)` says where the built dataset lives and
    `prepare(data_config, argument, target_dir)` writes it there in the tensorflow-datasets
    layout (a TFDS builder's `download_and_prepare` does exactly that, atomically).
    """
    SOURCES[scheme] = Source(dataset_dir=dataset_dir, prepare=prepare, describe=describe)


def _split_source(source: str) -> tuple[str, Source, str]:
    scheme, _, argument = source.partition(":")
    if scheme not in SOURCES:
        raise UserError(
            f"Unknown data.source '{source}': scheme '{scheme}' is not registered.{did_you_mean(scheme, SOURCES)} "
            f"Known sources: {'; '.join(s.describe for s in SOURCES.values())}."
        )
    return scheme, SOURCES[scheme], argument


def _synthetic_config(data: DataConfig):
    from data.synthetic_shapes import config_for

    return config_for(data.image_size, data.num_train, data.num_val, data.num_shards)


def _synthetic_dir(data: DataConfig, argument: str) -> Path:
    return Path(data.data_dir) / "synthetic_shapes" / _synthetic_config(data).name / "1.0.0"


def _synthetic_prepare(data: DataConfig, argument: str, target: Path) -> None:
    import tensorflow_datasets as tfds

    from data.synthetic_shapes import Builder

    builder = Builder(config=_synthetic_config(data), data_dir=data.data_dir)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=data.num_shards))


register_source("synthetic", describe="synthetic (the built-in shapes dataset)",
                dataset_dir=_synthetic_dir, prepare=_synthetic_prepare)


def _is_built(directory: Path) -> bool:
    return (directory / "dataset_info.json").is_file()


def remove_incomplete(directory: Path) -> list[Path]:
    """Delete what an interrupted build left beside `directory` (tensorflow-datasets writes into
    an `incomplete.*` folder and renames it when the build is complete)."""
    leftovers = sorted(directory.parent.glob("incomplete.*")) if directory.parent.is_dir() else []
    for leftover in leftovers:
        shutil.rmtree(leftover, ignore_errors=True)
    return leftovers


def prepare(data: DataConfig) -> tuple[DatasetSpec, bool]:
    """Build the dataset unless it is already there. Returns (spec, built_now)."""
    _, source, argument = _split_source(data.source)
    directory = source.dataset_dir(data, argument)
    if _is_built(directory):
        return _read_spec(directory), False
    for leftover in remove_incomplete(directory):
        print(f"Removed the leftovers of an interrupted build: {leftover}", flush=True)
    source.prepare(data, argument, directory)
    if not _is_built(directory):
        raise UserError(f"Building data.source '{data.source}' finished but wrote no dataset to {directory}.")
    return _read_spec(directory), True


def locate(data: DataConfig, build_hint: str = "make data") -> DatasetSpec:
    """The built dataset for `data`, or a UserError with the command that builds it."""
    _, source, argument = _split_source(data.source)
    directory = source.dataset_dir(data, argument)
    if not _is_built(directory):
        raise UserError(
            f"The dataset for data.source '{data.source}' is not built: {directory} does not exist. "
            f"Build it once with: {build_hint}"
        )
    return _read_spec(directory)


def data_command(config_path: str | None, overlays: list[str] = (), overrides: list[str] = ()) -> str:
    """The command that builds the dataset a config (with these overlays and overrides) trains on."""
    from train import config as config_lib

    data_sets = [o for o in overrides if o.startswith("data.")]
    try:
        wanted = config_lib.load(config_path, data_sets, layers=overlays).data
        if wanted == config_lib.load("configs/base.yaml").data:
            return "make data"
    except UserError:
        pass
    parts = ["python -m train data"]
    if config_path:
        parts.append(f"--config {config_path}")
    parts += [f"--overlay {o}" for o in overlays] + [f"--set {o}" for o in data_sets]
    return " ".join(parts)


def _read_spec(directory: Path) -> DatasetSpec:
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
        encoding=image.encoding_format or "jpeg",
        shard_lengths=tuple(
            (os.fspath(path), int(length))
            for split in (train, val)
            for path, length in zip(split.filepaths, split.shard_lengths)
        ),
    )
