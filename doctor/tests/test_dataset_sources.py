"""The line that built each stage: recorded by `profile`'s site hook, matched to the iterator tree by the analyser.

The matching is tested on recorded graphs written out here (fast, no TensorFlow); the hook once on an
unmodified script through the CLI, whose planted stage must be named by its own line.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from step_doctor.diagnose.dataset_sources import SourceLine, Sources, kinds
from tests.conftest import STEP_DOCTOR
from tests.test_profile import profile, script


def node(number, kind, inputs=(), line=None, iterated=None, by=None):
    found = {"id": number, "kind": kind, "inputs": list(inputs)}
    found.update({"file": "/home/me/train.py", "line": line, "code": f"line {line}"} if line else {"by": by or "keras"})
    if iterated is not None:
        found["iterated"] = iterated
    return found


def test_class_and_iterator_names_reduce_to_one_kind():
    assert kinds("_ParallelMapDataset") == kinds("ParallelMapV2") == kinds("_MapDataset") == kinds("Map") == ("map",)
    assert kinds("_BatchDataset") == kinds("BatchV2") == kinds("PaddedBatchV2") == ("batch",)
    assert kinds("MapAndBatch") == ("batch", "map")  # fused by tf.data: the batch is the outer one
    assert kinds("_TFRecordDataset") == kinds("TFRecord") == ("tfrecord",)
    # the public reader builds the stage over its files (FlatMap, or ParallelInterleave reading in parallel) too
    assert kinds("TFRecordDatasetV2") == ("flat_map", "interleave", "tfrecord")
    assert kinds("ParallelInterleaveV4[0]") == kinds("_ParallelInterleaveDataset") == ("interleave",)
    assert kinds("_OptionsDataset") == ("options",)  # no iterator of its own: the trace never names it


def test_each_stage_gets_the_training_datasets_line_not_a_validation_datasets_of_the_same_shape():
    nodes = [
        node(0, "_TensorSliceDataset", line=10),
        node(1, "_MapDataset", [0], line=11),
        node(2, "_BatchDataset", [1], line=12),
        node(3, "_RepeatDataset", [2], line=12),
        node(4, "_OptionsDataset", [3], iterated=0),  # Keras's wrapper, the one fit iterated
        # the validation dataset: the same shape, built later, iterated after
        node(5, "_TensorSliceDataset", line=20),
        node(6, "_MapDataset", [5], line=21),
        node(7, "_BatchDataset", [6], line=22),
        node(8, "_RepeatDataset", [7], line=22, iterated=1),
    ]
    lines = Sources(nodes).lines(
        [
            "Iterator::Root::Prefetch",  # injected by tf.data: no dataset of its own, nothing above it
            "Iterator::Root::Prefetch::ForeverRepeat",
            "Iterator::Root::Prefetch::ForeverRepeat::BatchV2",
            "Iterator::Root::Prefetch::ForeverRepeat::BatchV2::ParallelMapV2",  # map parallelization rewrote it
            "Iterator::Root::Prefetch::ForeverRepeat::BatchV2::ParallelMapV2::TensorSlice",
        ]
    )
    assert "Iterator::Root::Prefetch" not in lines
    assert lines["Iterator::Root::Prefetch::ForeverRepeat::BatchV2::ParallelMapV2"].line == 11
    assert lines["Iterator::Root::Prefetch::ForeverRepeat::BatchV2"].line == 12
    assert lines["Iterator::Root::Prefetch::ForeverRepeat::BatchV2::ParallelMapV2::TensorSlice"].line == 10


def test_the_stage_over_a_readers_files_takes_the_readers_line_not_the_repeat_above_it():
    nodes = [
        node(0, "_TensorSliceDataset", line=9),  # TFRecordDataset's own: its file names, its FlatMap
        node(1, "_TFRecordDataset", line=9),
        node(2, "_FlatMapDataset", [0], line=9),
        node(3, "TFRecordDatasetV2", [0], line=9),
        node(4, "_RepeatDataset", [3], line=10),
        node(5, "_MapDataset", [4], line=10),
        node(6, "_BatchDataset", [5], line=10),
    ]
    reads = "Iterator::Root::MapAndBatch::ForeverRepeat::FlatMap"
    lines = Sources(nodes).lines(
        ["Iterator::Root::MapAndBatch", "Iterator::Root::MapAndBatch::ForeverRepeat", reads, f"{reads}::TFRecord"]
    )
    assert lines[reads].line == lines[f"{reads}::TFRecord"].line == 9 and lines[reads].kind == "TFRecordDatasetV2"
    assert lines["Iterator::Root::MapAndBatch::ForeverRepeat"].line == 10


def test_fused_stages_and_readers_opened_inside_a_function_take_the_nearest_line_above():
    nodes = [
        node(0, "_TensorSliceDataset", line=5),  # the file names
        node(1, "_ParallelInterleaveDataset", [0], line=6),
        node(2, "TFRecordDatasetV2", line=6, by=None),  # built inside interleave's function, a chain of its own
        node(3, "_MapDataset", [1], line=7),
        node(4, "_BatchDataset", [3], line=8),
    ]
    lines = Sources(nodes).lines(
        [
            "Iterator::Root::MapAndBatch",
            "Iterator::Root::MapAndBatch::ParallelInterleaveV4",
            "Iterator::Root::MapAndBatch::ParallelInterleaveV4[0]::TFRecord",
            "Iterator::Root::MapAndBatch::ParallelInterleaveV4::TensorSlice",
        ]
    )
    assert lines["Iterator::Root::MapAndBatch"].line == 7  # the map, the inner of the two it fused
    assert lines["Iterator::Root::MapAndBatch::ParallelInterleaveV4"].line == 6
    assert lines["Iterator::Root::MapAndBatch::ParallelInterleaveV4::TensorSlice"].line == 5
    assert lines["Iterator::Root::MapAndBatch::ParallelInterleaveV4[0]::TFRecord"].line == 6


def test_datasets_built_by_a_library_give_no_line_and_no_record_gives_none(tmp_path):
    only_keras = Sources([node(0, "_TensorSliceDataset", by="keras"), node(1, "_BatchDataset", [0], by="keras")])
    assert only_keras.lines(["Iterator::Root::BatchV2", "Iterator::Root::BatchV2::TensorSlice"]) == {}
    session = tmp_path / "run" / "plugins" / "profile" / "2026_12_05"
    session.mkdir(parents=True)
    assert Sources.beside(session) is None
    (tmp_path / "run" / "dataset_sources.json").write_text("{not json")
    assert Sources.beside(session) is None
    (tmp_path / "run" / "dataset_sources.json").write_text(json.dumps({"datasets": [node(0, "_RangeDataset", line=3)]}))
    assert Sources.beside(session).lines(["Iterator::Root::Range"])["Iterator::Root::Range"] == SourceLine(
        "/home/me/train.py", 3, "line 3", None, "_RangeDataset"
    )


def test_one_pass_over_records_tf_data_cannot_count_is_counted_by_reading_them_once(tmp_path):
    import tensorflow as tf

    from step_doctor.profile.site import dataset_sources as site

    files = []
    for shard in range(3):  # 3 real TFRecord shards of 7 records: 21 records tf.data cannot count
        files.append(str(tmp_path / f"part-{shard}.tfrecord"))
        with tf.io.TFRecordWriter(files[-1]) as writer:
            for record in range(7):
                writer.write(b"x" * (record + 1))
    records = tf.data.TFRecordDataset(files)
    parsed = records.map(tf.strings.length).prefetch(2)
    assert parsed.cardinality() == tf.data.UNKNOWN_CARDINALITY
    assert site.count_elements(parsed.batch(4)) == 6 and site.count_elements(parsed.batch(4, drop_remainder=True)) == 5
    assert getattr(records, site.COUNTED) == 21  # read once, for every iterator a loop makes later
    looped = parsed.repeat().batch(4)
    assert site.pass_steps(looped) is None and site.pass_steps(looped, count=True) == 6  # only where prove asks
    assert site.count_elements(records.filter(lambda r: tf.strings.length(r) > 3)) is None  # its length is its data's
    assert site.count_elements(tf.data.TFRecordDataset(files).map(tf.strings.length), seconds=0.0) is None
    assert site.largest_element(records.batch(7)) == sum(range(1, 8))


SLOW_MAP = """
import time
import numpy as np
import tensorflow as tf
import keras


def slow(a):
    time.sleep(0.004)
    return a


def load(a, b):
    a = tf.numpy_function(slow, [a], tf.float32)
    a.set_shape((8,))
    return a, b


x = np.random.default_rng(0).random((2048, 8), dtype=np.float32)
train = tf.data.Dataset.from_tensor_slices((x, x[:, :1]))
train = train.map(load)  # the planted stage
train = train.batch(16).repeat()
val = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).map(load).batch(16).repeat()
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(train, steps_per_epoch=30, validation_data=val, validation_steps=2, epochs=1, verbose=0)
"""


@pytest.mark.slow
def test_profile_names_the_line_that_built_the_stage_the_step_waits_on(tmp_path):
    name = script(tmp_path, SLOW_MAP)
    planted = SLOW_MAP.splitlines().index("train = train.map(load)  # the planted stage") + 1
    done = profile(tmp_path, "--json", "--logdir", "logs", "--", sys.executable, name)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(done.stdout)["runs"]["my_train"]
    first = run["recommendations"][0]
    assert first["cause"] in ("python-in-map", "sequential-map"), first
    assert first["built_at"]["file"] == str(tmp_path / name) and first["built_at"]["line"] == planted, first
    assert first["built_at"]["code"] == "train = train.map(load)  # the planted stage"
    recorded = json.loads((tmp_path / "logs" / "my_train" / "dataset_sources.json").read_text())
    assert {n["kind"] for n in recorded["datasets"]} >= {"_MapDataset", "_BatchDataset", "_RepeatDataset"}
    text = subprocess.run(
        [str(STEP_DOCTOR), "diagnose", "logs"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert f"built at: {name}:{planted}: train = train.map(load)" in text.stdout, text.stdout[-3000:]
