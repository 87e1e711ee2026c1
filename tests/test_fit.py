"""Every shipped preset trains a few steps end to end on the tiny dataset."""

import dataclasses
import json
from pathlib import Path

import pytest
import tensorflow as tf

from tests.conftest import NO_PROFILE, PROFILE_EARLY, ROOT, SHORT_RUN, quiet
from train import config
from train.training import devices, fit_loop, plan

PRESETS = sorted(p for p in (ROOT / "configs").glob("*.yaml"))
# Two epochs of 4 steps, with a profile window or without.
PROFILED = SHORT_RUN + PROFILE_EARLY + ["train.steps_per_epoch=4"]
UNPROFILED = SHORT_RUN + NO_PROFILE + ["train.steps_per_epoch=4"]


def scalar_tags(folder: Path) -> set[str]:
    tags = set()
    for path in folder.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(value.tag for value in event.summary.value)
    return tags


@pytest.mark.parametrize(  # the optimized preset in the fast tests (it has the most knobs on); all in `make test`
    "preset", [pytest.param(p, marks=[] if p.stem == "optimized" else [pytest.mark.slow], id=p.stem) for p in PRESETS]
)
def test_every_shipped_preset_trains_a_few_steps(preset, tiny_sets):
    cfg = config.load(preset, tiny_sets + PROFILED + ["model.name=tiny", "model.width=8"])
    summary = fit_loop.run(cfg, config_path=str(preset), log=quiet)
    run_dir = cfg.run_dir
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["examples_per_sec"] > 0 and saved["step_time_ms"] > 0
    assert saved["epochs"] == 2 and 0.0 <= saved["val_accuracy"] <= 1.0 and saved["final_accuracy"] is not None
    assert saved["device"] == devices.detect().describe()  # this machine, as found: CPU only here, Nx GPU with GPUs
    assert len(saved["epoch_examples_per_sec"]) == 2 and saved["warmup_excluded"]
    assert summary["examples_per_sec"] == saved["examples_per_sec"]

    resolved = config.load(run_dir / "config.yaml")
    assert resolved.train.precision in ("float32", "mixed_float16", "mixed_bfloat16")
    assert isinstance(resolved.train.jit_compile, bool) and isinstance(resolved.train.steps_per_execution, int)
    chosen = ("cache", "augment", "shuffle_before_decode")  # every `auto` of the pipeline resolved, the rest as given
    assert "auto" not in [getattr(resolved.pipeline, key) for key in chosen]
    assert dataclasses.replace(resolved.pipeline, **{key: getattr(cfg.pipeline, key) for key in chosen}) == cfg.pipeline

    assert {"examples_per_sec", "step_time_ms"} <= scalar_tags(run_dir / "train")
    assert {"epoch_loss", "epoch_accuracy"} <= scalar_tags(run_dir / "train")
    assert "cpu_utilization_percent" in scalar_tags(run_dir / "system")

    profile = saved["profile"]
    assert profile["has_step_markers"], profile
    assert saved["profiled_steps_excluded"] >= 1  # traced steps run slower: not among the timed ones
    assert profile["steps"] >= 1 and saved["input_bound_percent"] is not None
    assert saved["cpu_utilization_percent"] is not None


@pytest.mark.slow
@pytest.mark.stack
def test_the_cpu_scenario_overlay_trains(tiny_sets):
    cfg = config.load(
        ROOT / "configs/optimized.yaml", tiny_sets + UNPROFILED, layers=[ROOT / "configs/scenarios/cpu.yaml"]
    )
    summary = fit_loop.run(cfg, log=quiet)
    assert summary["model"] == "tiny" and summary["examples_per_sec"] > 0


@pytest.mark.slow
def test_rerun_replaces_the_previous_run(tiny_sets):
    cfg = config.load(ROOT / "configs/optimized.yaml", tiny_sets + PROFILED + ["model.name=tiny"])
    fit_loop.run(cfg, log=quiet)
    fit_loop.run(cfg, log=quiet)
    sessions = list((cfg.run_dir / "plugins" / "profile").iterdir())
    assert len(sessions) == 1


def test_batch_larger_than_the_dataset_is_a_clear_error(tiny_sets):
    from train.core.errors import UserError

    cfg = config.load(ROOT / "configs/optimized.yaml", tiny_sets + ["pipeline.batch_size=512"])
    with pytest.raises(UserError, match=r"batch_size \(512\) is larger than the training split"):
        fit_loop.run(cfg, log=quiet)


def test_the_profile_window_follows_the_epoch_that_fills_the_cache():
    """A window in the cache's filling epoch shows decoding the later epochs do not do: it moves past that epoch
    where the run goes on long enough, and stays where it was otherwise (or without a cache)."""
    cfg = config.load(ROOT / "configs" / "base.yaml", ["profile.start_step=30", "profile.num_steps=10"])
    assert plan.profile_window(cfg, total_steps=1000, steps_per_execution=1, filling=0) == 30
    assert plan.profile_window(cfg, total_steps=1000, steps_per_execution=1, filling=312) == 342
    # 12 steps traced from 342 end at 354: a shorter run starts them as late as it can, still past the filling epoch
    assert plan.profile_window(cfg, total_steps=354, steps_per_execution=1, filling=312) == 342
    assert plan.profile_window(cfg, total_steps=330, steps_per_execution=1, filling=312) == 318
    assert plan.profile_window(cfg, total_steps=323, steps_per_execution=1, filling=312) == 30  # none past it
    assert plan.profile_window(cfg, total_steps=20, steps_per_execution=1, filling=312) == 8  # short: earlier
    assert plan.profile_window(cfg, total_steps=1000, steps_per_execution=16, filling=312) == 342
