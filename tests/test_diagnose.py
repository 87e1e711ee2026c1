"""diagnose on real profiles: a deliberately slow pipeline, a fast one, and the stock Keras callback's."""

import json
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import run_cli
from train import models
from train.errors import UserError
from train.measure import diagnose
from train.measure.profiling import StepTraceProfiler


def _model():
    model = models.build_model("tiny", (16, 16, 3), 4, {"width": 4})
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _slow_dataset():
    def sleepy(index):
        time.sleep(0.02)
        return np.zeros((16, 16, 3), np.uint8), np.int64(index % 4)

    def load(index):
        image, label = tf.numpy_function(sleepy, [index], (tf.uint8, tf.int64))
        image.set_shape((16, 16, 3))
        label.set_shape(())
        return image, label

    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return tf.data.Dataset.range(10_000).map(load).batch(4).with_options(options)


def _fast_dataset():
    images, labels = np.zeros((64, 16, 16, 3), np.uint8), np.zeros((64,), np.int64)
    return tf.data.Dataset.from_tensors((images, labels)).repeat().prefetch(tf.data.AUTOTUNE)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    for name, dataset in (("slow", _slow_dataset()), ("fast", _fast_dataset())):
        _model().fit(
            dataset,
            steps_per_epoch=12,
            epochs=1,
            verbose=0,
            callbacks=[StepTraceProfiler(root / name, start_step=2, num_steps=6)],
        )
    stock = root / "stock"
    _model().fit(
        _fast_dataset(),
        steps_per_epoch=12,
        epochs=1,
        verbose=0,
        callbacks=[keras.callbacks.TensorBoard(str(stock), profile_batch=(2, 8))],
    )
    return root


def test_slow_pipeline_is_input_bound_and_the_slow_stage_is_named(logs):
    result = diagnose.diagnose(logs / "slow")
    item = result["runs"]["."]
    assert item["verdict"] == "input-bound"
    assert item["profile"]["input_bound_percent"] >= 50
    assert item["profile"]["slow_stages"][0]["stage"].startswith("Map")
    top = item["recommendations"][0]
    assert top["cause"] == "slow input pipeline" and "Map" in top["evidence"]
    assert "num_parallel_calls" in top["fix"]


def test_fast_pipeline_is_not_input_bound(logs):
    item = diagnose.diagnose(logs / "fast")["runs"]["."]
    assert item["verdict"] != "input-bound"
    assert item["profile"]["input_bound_percent"] < 5
    assert all(rec["cause"] != "slow input pipeline" for rec in item["recommendations"])


def test_profile_without_step_markers_says_how_to_capture_one(logs):
    item = diagnose.diagnose(logs / "stock")["runs"]["train"]
    assert item["verdict"] == "unknown"
    assert "_r=1" in item["how_to_capture"]
    assert "No step marker" in " ".join(item["profile"]["diagnostics"])
    assert "no step markers" in diagnose.render(diagnose.diagnose(logs / "stock"))


def test_folder_without_profiles_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="No TensorBoard profile"):
        diagnose.diagnose(tmp_path)


def test_cli_json_and_the_regression_guard(logs):
    result = run_cli("diagnose", str(logs), "--json", "--fail-if-input-bound", "20", timeout=120)
    assert result.returncode == 3, result.stderr
    parsed = json.loads(result.stdout)
    assert parsed["runs"]["slow"]["verdict"] == "input-bound"
    assert "slow" in result.stderr and "fast" not in result.stderr
    passing = run_cli("diagnose", str(logs / "fast"), "--fail-if-input-bound", "20", timeout=120)
    assert passing.returncode == 0 and "verdict:" in passing.stdout
