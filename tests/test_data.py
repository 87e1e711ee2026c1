import os
from pathlib import Path

import pytest

from train import config, sources
from train.cli import arguments
from train.core.errors import UserError
from train.shards import records

ROOT = Path(__file__).resolve().parents[1]


def test_builder_writes_the_requested_shards(tiny_spec):
    assert len(tiny_spec.train_files) == 4 and len(tiny_spec.val_files) == 4
    assert (tiny_spec.num_train, tiny_spec.num_val) == (128, 32)
    assert tiny_spec.image_shape == (32, 32, 3) and tiny_spec.encoding == "jpeg"
    assert tiny_spec.num_classes == 6
    assert all(os.path.getsize(f) > 0 for f in tiny_spec.train_files)


def test_prepare_is_a_no_op_when_built(tiny_data_dir):
    from tests.conftest import data_sets

    cfg = config.load(ROOT / "configs/base.yaml", data_sets(tiny_data_dir))
    before = {f: os.path.getmtime(f) for f in sources.locate(cfg.data).train_files}
    spec, built = sources.prepare(cfg.data)
    assert not built
    assert {f: os.path.getmtime(f) for f in spec.train_files} == before


def test_records_read_in_python_match_tfrecord_dataset(tiny_spec):
    import tensorflow as tf

    path = tiny_spec.train_files[0]
    python_payloads = [payload for _, payload in records.read_records(path)]
    tf_payloads = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    assert python_payloads == tf_payloads and len(python_payloads) == 32
    image, label = records.parse_example(python_payloads[0])
    assert image[:2] == b"\xff\xd8" and 0 <= label < 6  # a JPEG and a class index


def test_labels_follow_what_is_drawn():
    """The same seed draws the same image; every class appears; classes look different."""
    import numpy as np

    from data.synthetic_shapes.synthetic_shapes_dataset_builder import SHAPES, draw_example

    first = draw_example(np.random.default_rng([0, 0, 7]), 32)
    again = draw_example(np.random.default_rng([0, 0, 7]), 32)
    assert first[1] == again[1] and (first[0] == again[0]).all()
    labels = {draw_example(np.random.default_rng([0, 0, i]), 32)[1] for i in range(200)}
    assert labels == set(range(len(SHAPES)))


def test_missing_dataset_names_the_command_that_builds_it(tmp_path):
    cfg = config.load(ROOT / "configs/optimized.yaml", [f"data.data_dir={tmp_path}"])
    with pytest.raises(UserError) as error:
        sources.locate(cfg.data, arguments.data_command("configs/optimized.yaml", [], [f"data.data_dir={tmp_path}"]))
    message = str(error.value)
    assert "is not built" in message
    assert f"python -m train data --config configs/optimized.yaml --set data.data_dir={tmp_path}" in message


def test_default_data_is_built_with_make_data():
    assert arguments.data_command("configs/optimized.yaml") == "make data"
    assert arguments.data_command("configs/naive.yaml", [], ["pipeline.batch_size=8"]) == "make data"


def test_unknown_source_scheme_is_rejected():
    cfg = config.load(ROOT / "configs/base.yaml", ["data.source=s3:bucket"])
    with pytest.raises(UserError, match="scheme 's3' is not registered"):
        sources.prepare(cfg.data)
