"""Playing the forker: your own image folder, a TFDS dataset by name, your own model."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import (
    NO_PROFILE,
    ROOT,
    SHORT_RUN,
    TINY_MODEL,
    build_pipeline,
    make_image_folder,
    quiet,
    run_cli,
    set_args,
)
from train import config, models, sources
from train.core.errors import UserError
from train.shards import convert
from train.training import fit_loop

# Two unprofiled epochs of batches of 8 (a converted folder of 48 images trains too), any model.
SHORT = SHORT_RUN + NO_PROFILE + ["pipeline.batch_size=8", "pipeline.shuffle_buffer=64"]


def source_sets(tmp_path: Path, source: str, size: int = 32) -> list[str]:
    return [
        f"data.source={source}",
        f"data.data_dir={tmp_path / 'built'}",
        f"data.image_size={size}",
        "data.num_shards=2",
        f"runs_dir={tmp_path / 'runs'}",
    ]


@pytest.mark.slow
def test_an_image_folder_becomes_shards_and_trains_with_the_optimized_preset(tmp_path):
    folder = make_image_folder(tmp_path / "my_images")
    sets = source_sets(tmp_path, f"imagefolder:{folder}")
    result = run_cli("data", "--config", "configs/optimized.yaml", *set_args(sets))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Built: imagefolder_my_images" in result.stdout and "3 classes" in result.stdout
    assert "Skipped 1 unreadable image(s)" in result.stdout
    cfg = config.load(ROOT / "configs/optimized.yaml", sets + SHORT + TINY_MODEL)
    spec = sources.locate(cfg.data)
    assert spec.class_names == ("blue", "green", "red") and spec.image_shape == (32, 32, 3)
    assert spec.num_train + spec.num_val == 48 and spec.num_val > 0
    summary = fit_loop.run(cfg, log=quiet)
    assert summary["dataset"]["num_classes"] == 3 and summary["examples_per_sec"] > 0
    _, built = sources.prepare(cfg.data)  # the same folder again: its contents name the dataset
    assert not built


def test_both_presets_read_a_converted_folder_identically(tmp_path):
    folder = make_image_folder(tmp_path / "imgs", per_class=8)
    cfg = config.load(ROOT / "configs/optimized.yaml", source_sets(tmp_path, f"imagefolder:{folder}"))
    spec, built = sources.prepare(cfg.data)
    assert built

    def examples(preset):
        knobs = config.load(ROOT / f"configs/{preset}.yaml", source_sets(tmp_path, f"imagefolder:{folder}")).pipeline
        dataset = build_pipeline(spec, knobs, training=False, batch_size=knobs.batch_size)
        return sorted(
            (int(label), image.tobytes())
            for images, labels in dataset
            for image, label in zip(images.numpy(), labels.numpy())
        )

    assert examples("naive") == examples("optimized")


def test_folder_conversion_resumes_with_the_finished_shards(tmp_path):
    folder = make_image_folder(tmp_path / "imgs", per_class=8)
    data = config.load(ROOT / "configs/base.yaml", source_sets(tmp_path, f"imagefolder:{folder}")).data
    target = sources.SOURCES["imagefolder"].dataset_dir(data, str(folder))
    listing = sources.imagefolder_listing(str(folder), data.val_fraction)
    writer = convert.DatasetWriter(target, "imagefolder_imgs")
    convert.convert_files(writer, "train", listing["splits"]["train"], 32, 2)  # ... and then the power went out
    finished = {p: p.stat().st_mtime_ns for p in writer.staging.glob("*train*")}
    assert len(finished) == 2 and not target.exists()
    spec, built = sources.prepare(data)
    assert built and spec.num_train == sum(1 for _ in listing["splits"]["train"]) - 1  # minus broken.jpg or not
    assert not writer.staging.exists()
    assert all((target / p.name).stat().st_mtime_ns == mtime for p, mtime in finished.items())


@pytest.mark.slow
def test_a_tfds_dataset_by_name_works_offline(tmp_path):
    import tensorflow_datasets as tfds

    cfg = config.load(ROOT / "configs/optimized.yaml", source_sets(tmp_path, "tfds:cifar10") + SHORT + TINY_MODEL)
    source = sources.SOURCES["tfds"]
    with tfds.testing.mock_data(num_examples=48):  # random examples instead of the download
        source.prepare(cfg.data, "cifar10", source.dataset_dir(cfg.data, "cifar10"))
    spec = sources.locate(cfg.data)
    assert spec.num_train == 48 and spec.num_val == 48 and spec.num_classes == 10
    assert spec.image_shape == (32, 32, 3)
    summary = fit_loop.run(cfg, log=quiet)
    assert summary["dataset"]["num_classes"] == 10


@pytest.mark.slow
def test_a_model_registered_by_the_forker_trains_by_name(tiny_sets):
    @models.register_model("forker_mlp")
    def forker_mlp(input_shape, num_classes, hidden: int = 32):
        import keras

        inputs = keras.Input(shape=input_shape, dtype="uint8")
        x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
        x = keras.layers.Dense(hidden, activation="relu")(x)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(x))

    cfg = config.load(ROOT / "configs/optimized.yaml", tiny_sets + SHORT + ["model.name=forker_mlp", "model.hidden=16"])
    assert cfg.model.params == {"hidden": 16}
    summary = fit_loop.run(cfg, log=quiet)
    assert summary["model"] == "forker_mlp" and summary["val_accuracy"] is not None


@pytest.mark.long
def test_a_keras_applications_model_trains_on_the_tiny_dataset(tiny_sets):
    cfg = config.load(
        ROOT / "configs/optimized.yaml", tiny_sets + SHORT + ["train.epochs=1", "model.name=mobilenet_v3_small"]
    )
    summary = fit_loop.run(cfg, log=quiet)
    assert summary["parameters"] > 100_000


@pytest.mark.parametrize(
    "layout, pattern",
    [
        ("missing", r"does not exist"),
        ("empty", r"holds no images"),
        ("loose", r"no class sub-folders. Put each class in its own folder"),
        ("one_class", r"only one class"),
    ],
)
def test_bad_image_folders_fail_before_any_work(tmp_path, layout, pattern):
    root = tmp_path / "imgs"
    if layout != "missing":
        root.mkdir()
    if layout == "loose":
        Image.new("RGB", (8, 8)).save(root / "a.jpg")
    if layout == "one_class":
        (root / "cats").mkdir()
        Image.new("RGB", (8, 8)).save(root / "cats" / "a.jpg")
    result = run_cli("data", "--set", f"data.source=imagefolder:{root}", "--set", f"data.data_dir={tmp_path}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert __import__("re").search(pattern, result.stderr), result.stderr
    assert not list(tmp_path.glob("imagefolder"))


@pytest.mark.slow
def test_unknown_tfds_name_and_scheme_fail_before_any_work(tmp_path):
    result = run_cli("data", "--set", "data.source=tfds:cifar1O", "--set", f"data.data_dir={tmp_path}")
    assert result.returncode == 2 and "has no dataset 'cifar1O'" in result.stderr and "cifar10" in result.stderr
    with pytest.raises(UserError, match="scheme 's3' is not registered"):  # the same error, in this process
        sources.prepare(
            config.load(ROOT / "configs/base.yaml", ["data.source=s3://bucket/x", f"data.data_dir={tmp_path}"]).data
        )
    assert list(tmp_path.iterdir()) == []
