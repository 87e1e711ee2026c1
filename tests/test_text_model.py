"""The text models: registered by name, blind to padding and to the other texts of a packed row, trainable
with every preset, and servable on raw strings."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import ROOT
from tests.text_helpers import build, preset_knobs, tiny_text_spec  # noqa: F401
from train import models
from train.workloads.text import pipeline, raw_shards, vocabulary
from train.workloads.text.model import TokenInput, serving_model

SMALL = {"dim": 16, "heads": 2, "feed_forward": 32}


def test_both_text_models_are_registered_with_checked_parameters():
    assert {"text_small", "text_transformer"} <= set(models.MODELS)
    assert models.resolve_params("text_small", {"dim": 64})["dim"] == 64
    assert models.resolve_params("text_transformer", {})["depth"] == 4
    with pytest.raises(Exception, match="has no parameter 'model.width'"):
        models.resolve_params("text_small", {"width": 4})


def small_pair():
    unpacked = models.build_model("text_small", TokenInput(60, 32), 3, SMALL)
    packed = models.build_model("text_small", TokenInput(60, 32, packed=True, max_segments=3), 3, SMALL)
    packed.set_weights(unpacked.get_weights())
    return unpacked, packed


def test_padding_and_packing_do_not_change_a_texts_logits():
    unpacked, packed = small_pair()
    first, second = [5, 9, 2, 33, 7], [11, 3, 4]

    def logits(ids, length):
        return unpacked(np.array([ids + [0] * (length - len(ids))], np.int32)).numpy()[0]

    np.testing.assert_allclose(logits(first, 5), logits(first, 32), atol=1e-5)
    row = first + second + [0] * 4
    inputs = {
        "token_ids": np.array([row], np.int32),
        "segment_ids": np.array([[1] * 5 + [2] * 3 + [0] * 4], np.int32),
        "positions": np.array([[0, 1, 2, 3, 4, 0, 1, 2, 0, 0, 0, 0]], np.int32),
    }
    per_segment = packed(inputs).numpy()[0]
    np.testing.assert_allclose(per_segment[0], logits(first, 8), atol=1e-5)
    np.testing.assert_allclose(per_segment[1], logits(second, 16), atol=1e-5)


@pytest.mark.parametrize(
    "preset, changes",
    [
        pytest.param("naive", {}, marks=[pytest.mark.slow, pytest.mark.stack]),
        pytest.param("optimized", {}, marks=pytest.mark.long),  # trained by test_text_run.py's own-CSV test
        pytest.param("optimized", {"batching": "pack"}, marks=[pytest.mark.slow, pytest.mark.stack]),
        pytest.param("optimized", {"batching": "pad_batch"}, marks=pytest.mark.long),
    ],
)
def test_every_preset_trains_a_few_steps(tiny_text_spec, preset, changes):  # noqa: F811
    spec = tiny_text_spec
    knobs, _ = pipeline.resolve(preset_knobs(preset, token_budget=2048, **changes), spec)
    packed = knobs.batching == "pack"
    shape = TokenInput(spec.vocab_size, spec.max_length, packed=packed, max_segments=knobs.max_segments)
    model = models.build_model("text_small", shape, spec.num_classes, SMALL)
    metric = {"weighted_metrics" if packed else "metrics": models.metrics()}
    model.compile(optimizer=models.optimizer(1e-3), loss=models.loss(), **metric)
    train = pipeline.build(pipeline.input_files(spec, knobs, True), spec, knobs, training=True, batch_size=8)
    val = pipeline.build(pipeline.input_files(spec, knobs, False), spec, knobs, training=False, batch_size=8)
    history = model.fit(train, steps_per_epoch=3, epochs=1, validation_data=val, verbose=0).history
    assert np.isfinite(history["loss"][0]) and 0 <= history["val_accuracy"][0] <= 1


def test_the_serving_model_takes_raw_strings(tiny_text_spec, tmp_path):  # noqa: F811
    spec = tiny_text_spec
    model = models.build_model("text_small", TokenInput(spec.vocab_size, spec.max_length), spec.num_classes, SMALL)
    terms = vocabulary.load_vocabulary(spec.vocabulary_path)
    serving = serving_model(model, terms, spec.max_length)
    texts = [text for text, _ in raw_shards.read_shard(spec.raw_val_files[0])][:4] + ["Unknown WORDS only!"]
    tokenize = vocabulary.PythonTokenizer(terms)
    expected = np.concatenate([model(np.array([tokenize(text)], np.int32)).numpy() for text in texts])
    np.testing.assert_allclose(serving(tf.constant(texts)).numpy(), expected, atol=1e-5)
    serving.save(tmp_path / "serving.keras")
    reloaded = keras.models.load_model(tmp_path / "serving.keras")
    np.testing.assert_allclose(reloaded(tf.constant(texts)).numpy(), expected, atol=1e-5)
    long_text = " ".join(["word"] * (spec.max_length + 50))
    assert serving(tf.constant([long_text])).shape == (1, spec.num_classes)


COMPILES = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tests.text_helpers import build, preset_knobs, tiny_data_config
    from train import models
    from train.workloads.text import build as build_lib, figures, pipeline
    from train.workloads.text.model import TokenInput

    spec, _ = build_lib.prepare(tiny_data_config(Path(sys.argv[1])), log=lambda line: None)
    knobs, _ = pipeline.resolve(preset_knobs("optimized", token_budget=1024, bucket_lengths=[64, 160, 512]), spec)
    model = models.build_model("text_small", TokenInput(spec.vocab_size, 512), 4, {"dim": 8, "heads": 1,
                               "feed_forward": 8})
    model.compile(optimizer="adam", loss=models.loss(), jit_compile=True)
    dataset = pipeline.build(spec.train_files, spec, knobs, training=True)
    model.fit(dataset, steps_per_epoch=12, epochs=1, verbose=0)
    print("shapes", figures.of_batches(dataset.take(12)).distinct_shapes)
    print("compiles", figures.count_compiles(sys.argv[2]))
    """
)


@pytest.mark.long
def test_xla_compiles_once_per_bucket(tmp_path):
    dump = tmp_path / "xla"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": f"--xla_dump_to={dump}", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, "-c", COMPILES, str(tmp_path / "data"), str(dump)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = dict(line.split() for line in result.stdout.splitlines() if line.startswith(("shapes", "compiles")))
    assert 2 <= int(figures["shapes"]) <= 3 and int(figures["compiles"]) <= int(figures["shapes"]) + 1
