"""What the text tests share: a tiny synthetic text dataset (built once per session under pytest's base
temporary folder), the presets' pipeline knobs, and reading a pipeline's examples back as plain tuples."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT

TINY_TEXT = {"num_train": 192, "num_val": 48, "num_shards": 2, "max_tokens": 3000, "max_length": 512}


def tiny_data_config(data_dir: Path, **changes):
    from train.workloads.text.settings import TextDataConfig

    return TextDataConfig(data_dir=str(data_dir), **{**TINY_TEXT, **changes})


@pytest.fixture(scope="session")
def tiny_text_spec(tmp_path_factory):
    """A 2-shard synthetic text dataset of 192 + 48 texts (built once; `prepare` finds it when built)."""
    from train.workloads.text import build

    data_dir = tmp_path_factory.getbasetemp() / "text-data"
    spec, _ = build.prepare(tiny_data_config(data_dir), log=lambda line: None)
    return spec


def preset_knobs(preset: str, **changes):
    """The text pipeline knobs of configs/text/<preset>.yaml, changed by `changes`."""
    from train import config

    return dataclasses.replace(config.load(ROOT / f"configs/text/{preset}.yaml").text.pipeline, **changes)


def build(spec, knobs, *, training: bool, **options):
    """The pipeline of `knobs` with the data-dependent `auto`s resolved for `spec`."""
    from train.workloads.text import pipeline

    resolved, _ = pipeline.resolve(knobs, spec)
    return pipeline.build(pipeline.input_files(spec, resolved, training), spec, resolved, training=training, **options)


def texts_of(batch) -> list[tuple[int, tuple[int, ...]]]:
    """(label, token ids without padding) of each text of a batch, packed or not."""
    if len(batch) == 3:
        inputs, labels, weights = (np.asarray(part) if not isinstance(part, dict) else part for part in batch)
        ids, segments = np.asarray(inputs["token_ids"]), np.asarray(inputs["segment_ids"])
        found = []
        for row in range(ids.shape[0]):
            for segment in range(labels.shape[1]):
                if weights[row, segment]:
                    found.append((int(labels[row, segment]), tuple(ids[row][segments[row] == segment + 1].tolist())))
        return found
    ids, labels = np.asarray(batch[0]), np.asarray(batch[1])
    return [(int(label), tuple(int(i) for i in row if i)) for row, label in zip(ids, labels)]


def all_texts(dataset, batches: int | None = None) -> Counter:
    found = Counter()
    for batch in dataset if batches is None else dataset.take(batches):
        found.update(texts_of(batch))
    return found
