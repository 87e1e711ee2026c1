"""Data that does not fit in memory: the scenario is honest, and each technique does what it says.

Speed is measured by `make bench SCENARIO=larger_than_memory` and `make ladder ...`, not here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys

import numpy as np
import pytest
import yaml

from tests.conftest import NO_PROFILE, ROOT, SHORT_RUN, build_pipeline, child_env, quiet
from train import config
from train.benchmarks import ladder
from train.training import fit_loop
from train.workloads.image import pipeline

SCENARIO = ROOT / "configs/scenarios/larger_than_memory.yaml"


def knobs(preset: str = "optimized", **changes):
    return dataclasses.replace(config.load(ROOT / f"configs/{preset}.yaml").pipeline, **changes)


def examples(spec, knob, training=False, batch_size=16, take=None):
    dataset = build_pipeline(spec, knob, training=training, batch_size=batch_size)
    if take:
        dataset = dataset.take(take)
    return [(int(label), image) for images, labels in dataset for image, label in zip(images.numpy(), labels.numpy())]


def digests(pairs):
    return sorted((label, hashlib.sha1(image.tobytes()).hexdigest()) for label, image in pairs)


def test_the_scenario_is_what_its_header_says():
    cfg = config.load(ROOT / "configs/optimized.yaml", layers=[SCENARIO])
    stored, trained = cfg.data.image_size, cfg.pipeline.output_size
    assert stored >= 192 and trained <= stored // 2
    decoded_mb = cfg.data.num_train * trained * trained * 3 / 2**20
    assert decoded_mb > cfg.pipeline.cache_limit_mb  # no decoded cache fits
    from data.synthetic_shapes.synthetic_shapes_dataset_builder import draw_example, encode_jpeg

    rng = np.random.default_rng(0)
    sizes = [len(encode_jpeg(draw_example(rng, stored)[0], 90)) for _ in range(40)]
    assert np.mean(sizes) >= 20 * 1024  # photo-like JPEG weight
    assert cfg.pipeline.cache_limit_mb > cfg.data.num_train * np.mean(sizes) / 2**20  # the records do fit


def test_the_scenarios_ladder_loads_and_every_rung_validates():
    rungs = ladder.load_ladder(ROOT / "configs/ladder/larger_than_memory.yaml")
    kept = []
    for rung in rungs["rungs"]:
        kept += [
            f"{key}={yaml.safe_dump(value).strip().removesuffix('...').strip()}" for key, value in rung["set"].items()
        ]
        config.load(ROOT / "configs/naive.yaml", kept, layers=[SCENARIO])
    assert {"pipeline.scaled_decode", "pipeline.cache", "pipeline.random_crop"} <= {
        key for rung in rungs["rungs"] for key in rung["set"]
    }


def test_dct_scaled_decode_gives_the_output_size_and_nearly_the_resized_pixels(tiny_spec):
    assert pipeline.decode_ratio(256, 128) == 2 and pipeline.decode_ratio(256, 64) == 4
    assert pipeline.decode_ratio(256, 100) == 2 and pipeline.decode_ratio(256, 256) == 1
    assert pipeline.decode_ratio(2048, 64) == 8  # libjpeg scales by 1/8 at most
    half = tiny_spec.image_shape[0] // 2
    full = examples(tiny_spec, knobs(output_size=half, scaled_decode=False, deterministic=True))
    scaled = examples(tiny_spec, knobs(output_size=half, scaled_decode=True, deterministic=True))
    assert [label for label, _ in full] == [label for label, _ in scaled]
    assert all(image.shape == (half, half, 3) for _, image in scaled)
    difference = np.mean([np.abs(a.astype(int) - b.astype(int)).mean() for (_, a), (_, b) in zip(full, scaled)])
    assert 0 < difference < 12  # another DCT method and filter: close, not the same pixels


def test_an_output_size_larger_than_the_stored_images_is_a_clear_error(tiny_spec):
    from train.core.errors import UserError

    with pytest.raises(UserError, match=r"pipeline.output_size 64 is larger than the stored images .*32x32"):
        pipeline.image_shape(tiny_spec, knobs(output_size=64))


def test_random_crops_decode_a_window_per_example_the_same_in_every_run(tiny_spec):
    size = tiny_spec.image_shape[0] // 2
    knob = knobs(output_size=size, random_crop=True, cache="none", deterministic=True, shuffle_buffer=0)
    first = examples(tiny_spec, knob, training=True, take=2)
    again = examples(tiny_spec, knob, training=True, take=2)
    assert digests(first) == digests(again)  # stateless per-element seeds: exact resumes stay exact
    plain = examples(tiny_spec, dataclasses.replace(knob, random_crop=False), training=True, take=2)
    assert all(image.shape == (size, size, 3) for _, image in first)
    assert digests(first) != digests(plain)
    validation = examples(tiny_spec, knob)  # validation is never cropped
    assert digests(validation) == digests(examples(tiny_spec, dataclasses.replace(knob, random_crop=False)))


@pytest.mark.parametrize("cache", ["encoded", "disk", "memory"])
def test_every_cache_yields_the_same_examples_as_no_cache(tiny_spec, tmp_path, cache):
    reference = digests(examples(tiny_spec, knobs(cache="none", deterministic=True)))
    knob = knobs(cache=cache, cache_dir=str(tmp_path / "snapshots"), deterministic=True)
    assert digests(examples(tiny_spec, knob)) == reference
    assert digests(examples(tiny_spec, knob)) == reference  # the second pass reads what the first kept
    if cache == "disk":
        assert any((tmp_path / "snapshots").rglob("*.snapshot")), "the snapshot is written to cache_dir"


def test_without_a_decoded_memory_cache_no_mirror_is_stored(tiny_spec):
    assert pipeline.mirrored(knobs(cache="memory"))
    for cache in ("encoded", "none", "disk"):
        assert not pipeline.mirrored(knobs(cache=cache))
    batches = examples(tiny_spec, knobs(cache="encoded"), training=True, batch_size=8, take=3)
    assert all(image.shape == tiny_spec.image_shape for _, image in batches)


# What a user's own script does with the trained model: import the module that registers the template's
# layers, load, predict. In a fresh process: this one has the layer registered by the training anyway.
LOAD_AND_PREDICT = """
import sys
import keras
import numpy as np
import train.workloads.image.augment
model = keras.models.load_model(sys.argv[1])
assert any("augment" in layer.name for layer in model.layers), [layer.name for layer in model.layers]
print("output shape", tuple(model(np.zeros((4, *model.input_shape[1:]), np.uint8), training=False).shape))
"""


@pytest.mark.long
def test_augmentation_on_the_device_trains_and_the_model_loads_in_a_fresh_process(tiny_sets):
    cfg = config.load(
        ROOT / "configs/optimized.yaml",
        tiny_sets + SHORT_RUN + NO_PROFILE + ["pipeline.augment=device", "model.name=tiny", "model.width=8"],
    )
    summary = fit_loop.run(cfg, log=quiet)
    assert np.isfinite(summary["final_loss"]) and "augment[device, in the model" in summary["pipeline"]
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_AND_PREDICT, str(cfg.run_dir / "model.keras")],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert f"output shape (4, {summary['dataset']['num_classes']})" in loaded.stdout
