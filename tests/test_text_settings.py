"""The text presets: typed like every other section of the config, wrong keys refused with the valid ones,
and loaded whole by train/config.py's loader (the config's `workload` and the text workload's `text` section)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT
from train import config, models
from train.core.errors import UserError

PRESETS = sorted((ROOT / "configs/text").glob("*.yaml"))


def load(path, overrides=()):
    """The text section and the whole config of a preset, by the main loader."""
    cfg = config.load(path, list(overrides))
    return cfg.text, cfg


@pytest.mark.parametrize("preset", ["naive", "optimized"])
def test_the_text_presets_load(preset):
    text, cfg = load(ROOT / f"configs/text/{preset}.yaml")
    assert cfg.workload == "text" and cfg.name == f"text_{preset}"
    assert text.data.source == "synthetic" and text.data.max_length == 512
    if preset == "naive":
        assert (text.pipeline.reader, text.pipeline.batching, text.pipeline.prefetch) == ("python", "pad_max", 0)
    else:
        assert (text.pipeline.reader, text.pipeline.batching, text.pipeline.prefetch) == ("tfrecord", "bucket", "auto")


def test_overrides_and_mistakes_are_checked_like_the_main_config():
    path = ROOT / "configs/text/optimized.yaml"
    text, _ = load(path, ["text.pipeline.token_budget=4096", "text.data.source=csv:x.csv"])
    assert text.pipeline.token_budget == 4096 and text.data.source == "csv:x.csv"
    with pytest.raises(
        UserError, match=r"unknown key 'text\.pipeline\.bucket_lenghts'\. Did you mean 'bucket_lengths'"
    ):
        load(path, ["text.pipeline.bucket_lenghts=[64]"])
    with pytest.raises(UserError, match=r"'text\.pipeline\.batching' must be 'pad_max' or 'pad_batch' or 'bucket'"):
        load(path, ["text.pipeline.batching=sorted"])
    with pytest.raises(UserError, match=r"'text\.pipeline\.token_budget' is 256 but must be >= data\.max_length"):
        load(path, ["text.pipeline.token_budget=256"])
    with pytest.raises(UserError, match=r"'text\.pipeline\.bucket_lengths' is \[64, 600\]"):
        load(path, ["text.pipeline.bucket_lengths=[64, 600]"])
    with pytest.raises(UserError, match=r"'text\.pipeline\.batching' is 'pack' but must be .* unless pipeline\.reader"):
        load(ROOT / "configs/text/naive.yaml", ["text.pipeline.batching=pack"])


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.name != "cpu.yaml"], ids=lambda p: p.name)
def test_every_text_preset_builds_as_a_whole_config(preset: Path):
    values = config._read_yaml(preset)
    values = config._merge(values, config._read_yaml(ROOT / "configs/text/cpu.yaml"))
    cfg = config.build(values, str(preset))
    assert cfg.workload == "text" and cfg.model.name == "text_small"
    assert cfg.train.precision == ("float32" if preset.name == "naive.yaml" else "auto")
    assert models.resolve_params(cfg.model.name, cfg.model.params)["dim"] == 32
    alone = config.build(config._read_yaml(preset), str(preset))
    assert alone.model.name == "text_transformer"
