from pathlib import Path

import pytest

from train import config
from train.core.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_every_shipped_preset_loads(path):
    cfg = config.load(path)
    assert cfg.name
    assert cfg.pipeline.batch_size >= 1


def test_naive_and_optimized_share_data_and_model():
    naive, optimized = config.load(ROOT / "configs/naive.yaml"), config.load(ROOT / "configs/optimized.yaml")
    assert naive.data == optimized.data and naive.model == optimized.model
    assert naive.pipeline.reader == "python" and naive.pipeline.prefetch == 0
    assert optimized.pipeline.reader == "tfrecord" and optimized.pipeline.augment == "batched"
    assert optimized.train.precision == "auto" and optimized.train.jit_compile == "auto"


def test_unknown_key_is_rejected_with_a_suggestion_and_the_valid_keys():
    with pytest.raises(UserError) as error:
        config.load(ROOT / "configs/optimized.yaml", ["pipeline.bach_size=64"])
    message = str(error.value)
    assert "pipeline.bach_size" in message and "Did you mean 'batch_size'" in message
    assert "prefetch" in message  # the valid keys are listed


def test_unknown_key_in_a_yaml_file_names_the_file(tmp_path):
    preset = tmp_path / "typo.yaml"
    preset.write_text(f"extends: {ROOT / 'configs/base.yaml'}\ntrian:\n  epochs: 3\n")
    with pytest.raises(UserError, match=r"typo.yaml.*unknown key 'trian'.*Did you mean 'train'"):
        config.load(preset)


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("pipeline.batch_size=0", r"'pipeline.batch_size' is 0 but must be >= 1"),
        ("train.learning_rate=-0.1", r"'train.learning_rate' is -0.1 but must be > 0"),
        ("data.num_shards=5000", r"'data.num_shards' is 5000 but must be at most the number of examples"),
        ("pipeline.cache=sometimes", r"'pipeline.cache' must be 'auto' or 'memory' or 'disk' or 'encoded' or 'none'"),
        ("train.epochs=two", r"'train.epochs' must be int, got 'two'"),
        ("pipeline.augment=python", r"'pipeline.augment' is 'python' but must be"),
        ("model.widht=8", r"model 'resnet' has no parameter 'model.widht'. Did you mean 'width'"),
        ("model.width=wide", r"'model.width' must be int"),
        ("model.name=resnett", r"unknown model 'resnett'. Did you mean 'resnet'"),
        ("batch_size", r"must look like key=value"),
    ],
)
def test_bad_values_are_rejected_before_any_work(override, pattern):
    built_in = ["data.source=synthetic", "model.name=resnet"]  # whatever a fork's base.yaml names
    with pytest.raises(UserError, match=pattern):
        config.load(ROOT / "configs/optimized.yaml", [*built_in, override])


def test_overrides_are_parsed_as_yaml_values():
    cfg = config.load(
        ROOT / "configs/optimized.yaml",
        ["pipeline.batch_size=64", "pipeline.deterministic=true", "train.jit_compile=false"],
    )
    assert cfg.pipeline.batch_size == 64 and cfg.pipeline.deterministic is True and cfg.train.jit_compile is False


def test_switching_model_drops_the_previous_models_parameters():
    cfg = config.load(ROOT / "configs/optimized.yaml", ["model.name=tiny"])
    assert cfg.model.name == "tiny" and cfg.model.params == {"width": 16}
    overlaid = config.load(ROOT / "configs/optimized.yaml", layers=[ROOT / "configs/scenarios/cpu.yaml"])
    assert overlaid.model.name == "tiny"


def test_saved_config_loads_back_unchanged(tmp_path):
    cfg = config.load(ROOT / "configs/naive.yaml", ["pipeline.batch_size=48"])
    config.save(cfg, tmp_path / "config.yaml", header="a header line")
    assert (tmp_path / "config.yaml").read_text().startswith("# a header line\n")
    assert config.load(tmp_path / "config.yaml") == cfg


def test_missing_config_file_lists_presets():
    with pytest.raises(UserError, match="does not exist"):
        config.load("configs/nope.yaml")


def test_extends_cycle_is_reported(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(UserError, match="cycle"):
        config.load(tmp_path / "a.yaml")
