"""The catalog of dataset sources: each ends as sharded TFRecords in the tensorflow-datasets layout.

`data.source` names a source as `scheme` or `scheme:argument`. A registered source knows where
its built dataset lives under `data.data_dir` and how to build it there; `prepare` builds it once
(a no-op when it is already there) and `locate` finds it for training, with a clear error naming
the exact command when it is missing. The built-in sources register themselves in
train/sources.py, the file a forker edits to add one.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

from train.core.errors import UserError, did_you_mean
from train.shards.spec import DatasetSpec, is_built, read_spec


@dataclasses.dataclass(frozen=True)
class Source:
    """How one scheme of `data.source` is located on disk and built."""

    dataset_dir: Callable[[object, str], Path]  # (the config's data section, argument) -> folder
    prepare: Callable[[object, str, Path], None]
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


def remove_incomplete(directory: Path) -> list[Path]:
    """Delete what an interrupted build left beside `directory` (tensorflow-datasets writes into
    an `incomplete.*` folder and renames it when the build is complete)."""
    leftovers = sorted(directory.parent.glob("incomplete.*")) if directory.parent.is_dir() else []
    for leftover in leftovers:
        shutil.rmtree(leftover, ignore_errors=True)
    return leftovers


def prepare(data) -> tuple[DatasetSpec, bool]:
    """Build the dataset unless it is already there. Returns (spec, built_now)."""
    _, source, argument = _split_source(data.source)
    directory = source.dataset_dir(data, argument)
    if is_built(directory):
        return read_spec(directory), False
    for leftover in remove_incomplete(directory):
        print(f"Removed the leftovers of an interrupted build: {leftover}", flush=True)
    source.prepare(data, argument, directory)
    if not is_built(directory):
        raise UserError(f"Building data.source '{data.source}' finished but wrote no dataset to {directory}.")
    return read_spec(directory), True


def locate(data, build_hint: str = "make data") -> DatasetSpec:
    """The built dataset for `data`, or a UserError with the command that builds it."""
    _, source, argument = _split_source(data.source)
    directory = source.dataset_dir(data, argument)
    if not is_built(directory):
        raise UserError(
            f"The dataset for data.source '{data.source}' is not built: {directory} does not exist. "
            f"Build it once with: {build_hint}"
        )
    return read_spec(directory)
