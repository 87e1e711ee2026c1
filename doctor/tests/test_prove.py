"""`profile --prove`: the fixes applied in memory, measured in paired runs, and written as a patch of the source.

The patch and the verdicts are tested on text and figures written here (fast); the whole loop once on an
unmodified script with a planted defect (a JPEG decode map written without num_parallel_calls, over data
that fits in memory), whose fixes must be applied where the line built the map, and whose patch must
apply and leave a script that exits as the original does. What the fixes gain is a measurement: the
long test checks the planted case's outcome, the slow one only that each figure is there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from step_doctor.diagnose.proofs import NO_GAIN, NOT_PROVED, PROVED, SLOWER, UNCLEAR, Proof
from step_doctor.profile import patch, prove
from tests.conftest import STEP_DOCTOR
from tests.test_profile import profile

SOURCE = textwrap.dedent(
    """\
    import tensorflow as T

    ds = T.data.Dataset.from_tensor_slices(x)
    ds = ds.map(load).batch(16).repeat()
    ds2 = (ds.map(
        load,
    )
      .batch(4))
    r = T.data.TFRecordDataset(files)
    done = ds.map(f, num_parallel_calls=2)
    """
)


def test_each_fix_is_written_into_the_call_that_built_the_stage_and_nothing_else_changes():
    fixed = patch.edit(
        SOURCE,
        [
            {"name": "parallel-calls", "line": 4},
            {"name": "cache", "line": 4, "kind": "_MapDataset"},
            {"name": "prefetch", "line": 4, "kind": "_RepeatDataset"},
            {"name": "parallel-calls", "line": 5},  # a call over several lines, with a trailing comma
            {"name": "cache", "line": 5, "kind": "_MapDataset"},
            {"name": "parallel-reads", "line": 9},
        ],
    )
    lines = fixed.splitlines()
    assert lines[3] == (
        "ds = ds.map(load, num_parallel_calls=T.data.AUTOTUNE).cache().batch(16).repeat().prefetch(T.data.AUTOTUNE)"
    )
    assert lines[4:8] == [
        "ds2 = (ds.map(",
        "    load, num_parallel_calls=T.data.AUTOTUNE,",
        ").cache()",
        "  .batch(4))",
    ]
    assert lines[8] == "r = T.data.TFRecordDataset(files, num_parallel_reads=T.data.AUTOTUNE)"
    assert [i for i, (a, b) in enumerate(zip(SOURCE.splitlines(), lines)) if a != b] == [3, 5, 6, 8]


def test_a_cache_tried_below_the_repeat_a_map_reads_moves_the_repeat_after_it():
    source = "ds = ds.repeat().map(load).batch(32)\nx = ds.repeat(2).map(f)  # c\ny = ds.map(f)\n"
    fixed = patch.edit(
        source,
        [
            {"name": "parallel-calls", "line": 1},
            {"name": "cache", "line": 1, "kind": "_MapDataset", "below_repeat": True},
            {"name": "prefetch", "line": 1, "kind": "_MapDataset"},
            {"name": "cache", "line": 2, "kind": "_MapDataset", "below_repeat": True},
        ],
    )
    assert fixed.splitlines() == [
        "ds = ds.map(load, num_parallel_calls=-1).cache().repeat().prefetch(-1).batch(32)",
        "x = ds.map(f).cache().repeat(2)  # c",
        "y = ds.map(f)",
    ]
    with pytest.raises(patch.PatchError, match=r"reads a repeat\(\) written elsewhere"):
        patch.edit(source, [{"name": "cache", "line": 3, "kind": "_MapDataset", "below_repeat": True}])


def test_a_trial_caches_below_the_repeat_and_the_shuffle_and_keeps_the_order_of_every_epoch():
    import tensorflow as tf

    from step_doctor.profile.site import dataset_sources
    from step_doctor.profile.site import fixes as fixes_lib

    here = {"file": __file__, "line": 0}
    fixes = fixes_lib.Fixes([{"name": "cache", "kind": "_MapDataset", **here}], lambda frame: here, print)
    fixes.tf = tf
    plain = tf.data.Dataset.range(6)
    swapped = fixes.below_repeat(0, plain.repeat(), lambda inner: inner.map(lambda x: x * 2))
    assert list(swapped.take(8).as_numpy_iterator()) == [0, 2, 4, 6, 8, 10, 0, 2]
    assert fixes.applied == {0: 1} and fixes.cached_below_repeat == {0} and not fixes.moved_shuffle
    # a seeded shuffle below the repeat moves after the cache: the same elements in the same order, epoch after epoch
    as_written = plain.shuffle(4, seed=7).repeat().map(lambda x: x * 3)
    moved = fixes.below_repeat(0, plain.shuffle(4, seed=7).repeat(), lambda inner: inner.map(lambda x: x * 3))
    assert list(moved.take(30).as_numpy_iterator()) == list(as_written.take(30).as_numpy_iterator())
    assert 0 in fixes.moved_shuffle and type(moved._input_dataset).__name__ == "_ShuffleDataset"
    # a shuffle with no repeat above it (epochs of fit) moves too
    once = fixes.below_repeat(0, plain.shuffle(6, seed=1), lambda inner: inner.map(lambda x: x + 1))
    assert list(once.as_numpy_iterator()) == list(plain.shuffle(6, seed=1).map(lambda x: x + 1).as_numpy_iterator())
    # one further below (a map between) would replay the first epoch's order: refused, the script runs as written
    deeper = plain.shuffle(6).map(lambda x: x).repeat()
    kept = fixes.below_repeat(0, deeper, lambda inner: inner.map(lambda x: x * 2))
    assert "replay the first epoch's order" in fixes.refused[0] and kept.cardinality() == tf.data.INFINITE_CARDINALITY
    # strings of no fixed size: their first elements are read to tell whether they fit (with the counted records)
    sized = fixes_lib.Fixes([], lambda frame: here, print, dataset_sources)
    sized.tf = tf
    words = tf.data.Dataset.from_tensor_slices(["a", "bbbb", "cc"])
    assert sized.cache_refusal(words) is None and fixes.cache_refusal(words).startswith("its elements have no fixed")
    assert dataset_sources.largest_element(words.map(lambda w: (w, tf.zeros([3], tf.int64)))) == 4 + 24


def test_a_repeat_and_a_shuffle_in_the_assignment_the_map_reads_move_after_the_cache():
    source = textwrap.dedent(
        """\
        def make(files, seed):
            ds = (T.data.Dataset.from_tensor_slices(files)  # every file
                  # in a new order each epoch
                  .shuffle(64, seed=seed)
                  .repeat())
            other = ds.map(g)
            ds = ds.map(decode, num_parallel_calls=4).batch(8)
            return ds
        """
    )
    fix = {"name": "cache", "line": 7, "kind": "_ParallelMapDataset", "below_repeat": True, "moved_shuffle": True}
    with pytest.raises(patch.PatchError, match="is read on line 6 too"):  # `other` would lose its shuffle and repeat
        patch.edit(source, [fix])
    fixed = patch.edit(source.replace("    other = ds.map(g)\n", "    other = ds0.map(g)\n"), [fix])
    assert fixed.splitlines()[1:7] == [  # the comments stay where they were
        "    ds = (T.data.Dataset.from_tensor_slices(files)  # every file",
        "          # in a new order each epoch",
        "          )",
        "    other = ds0.map(g)",
        "    ds = ds.map(decode, num_parallel_calls=4).cache().shuffle(64, seed=seed).repeat().batch(8)",
        "    return ds",
    ]
    # what the trial moved, no more: a repeat alone leaves the shuffle where it is
    only = patch.edit("ds = x.shuffle(4).repeat()\nds = ds.map(f)\n", [{**fix, "line": 2, "moved_shuffle": False}])
    assert only.splitlines() == ["ds = x.shuffle(4)", "ds = ds.map(f).cache().repeat()"]
    with pytest.raises(patch.PatchError, match=r"reads a repeat\(\) and shuffle\(\) written elsewhere"):
        patch.edit("ds = x.repeat()\nds = ds.map(f)\n", [{**fix, "line": 2}])


def test_a_comment_after_the_last_argument_and_a_file_without_a_tensorflow_name_are_kept_right():
    source = "from tensorflow import data\nds = data.Dataset.range(4).map(  # square it\n    f  # the function\n)\n"
    fixed = patch.edit(source, [{"name": "parallel-calls", "line": 2}])
    assert fixed.splitlines()[2] == "    f, num_parallel_calls=-1  # the function"  # -1 is tf.data.AUTOTUNE
    with pytest.raises(patch.PatchError, match="already passes num_parallel_calls"):
        patch.edit("ds = ds.map(f, 4)\n", [{"name": "parallel-calls", "line": 1}])


def test_a_fix_that_cannot_be_written_says_why():
    with pytest.raises(patch.PatchError, match="already passes num_parallel_calls"):
        patch.edit(SOURCE, [{"name": "parallel-calls", "line": 10}])
    with pytest.raises(patch.PatchError, match=r"no call of map\(\) on line 1"):
        patch.edit(SOURCE, [{"name": "parallel-calls", "line": 1}])


def test_the_diff_applies_with_git_apply_where_prove_ran(tmp_path):
    (tmp_path / "pkg").mkdir()
    source = tmp_path / "pkg" / "train.py"
    source.write_text(SOURCE)
    diff, notes = patch.unified_diff([{"name": "parallel-calls", "file": str(source), "line": 4}], tmp_path)
    assert notes == [] and diff.startswith("--- a/pkg/train.py\n+++ b/pkg/train.py\n")
    (tmp_path / "fix.patch").write_text(diff)
    done = subprocess.run(["git", "apply", "fix.patch"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "ds.map(load, num_parallel_calls=T.data.AUTOTUNE).batch(16)" in source.read_text()
    broken, notes = patch.unified_diff([{"name": "parallel-calls", "file": str(source), "line": 1}], tmp_path)
    assert broken == "" and notes == [f"{source}: no call of map() on line 1"]


def test_a_fix_is_proved_only_when_every_round_gains_more_than_the_aa_control():
    def proof(base, times):
        candidate = prove.Candidate("cache at train.py:4", [{"name": "cache"}], ["sequential-map"], ["S"], 2.5)
        candidate.times = times
        return prove._proof(candidate, base, prove._aa_noise(base))

    base = [0.100, 0.102, 0.099]
    assert proof(base, [0.020, 0.021, 0.019]).verdict == PROVED
    assert proof(base, [0.020, 0.021, 0.019]).gain == pytest.approx(5.0, abs=0.01)  # the median round: 0.100 / 0.020
    assert proof(base, [0.099, 0.101, 0.100]).verdict == NO_GAIN
    assert proof(base, [0.150, 0.140, 0.160]).verdict == SLOWER
    assert proof(base, [0.083, 0.101, 0.079]).verdict == UNCLEAR  # two rounds gained, one did not
    assert proof(base, [None, None, None]).verdict == NOT_PROVED
    assert proof([0.100, None, 0.100], [0.020, 0.020, 0.020]).verdict == NOT_PROVED  # no A/A control: no proof
    assert "no A/A control" in proof([0.100, None, 0.100], [0.020, 0.020, 0.020]).why
    assert proof([0.100, 0.150, 0.100], [0.080, 0.110, 0.080]).verdict != PROVED  # within a noisy A/A control


def test_the_window_follows_one_pass_over_the_data_where_a_cache_is_tried():
    cache = prove.Candidate("cache", [{"name": "cache"}], [], [], None)
    calls = prove.Candidate("parallel calls", [{"name": "parallel-calls"}], [], [], None)
    assert prove.window(25.0, {"steps_seen": 400, "pass_steps": 4}, [calls]) == ((6, 125), None)
    assert prove.window(25.0, {"steps_seen": 400, "pass_steps": 40}, [calls, cache]) == ((42, 161), None)
    assert prove.window(25.0, {"steps_seen": 60, "pass_steps": 4}, [cache]) == ((6, 58), None)  # step 59 ends it
    steps, why = prove.window(25.0, {"steps_seen": 9, "pass_steps": 4}, [cache])
    assert steps is None and "trains 9 steps" in why and "one pass over the data" in why
    long = [cache]
    refused = prove._drop_long_caches(long, {"pass_steps": 5000}, 25.0)  # 125 s of steps before its window
    assert long == [] and "5000 steps" in refused[0].why and refused[0].verdict == NOT_PROVED


def test_a_proof_reads_back_as_written():
    proof = Proof("cache at t.py:4", ("cache",), ("sequential-map",), ("S",), PROVED, 3.01, 2.9, 3.2, 3, 0.02, 1.9)
    assert Proof.from_json(json.loads(json.dumps(proof.to_json()))) == proof
    assert proof.text == "proved x3.01 (x2.90-x3.20 over 3 rounds; A/A within 2.0%), estimated x1.90"


PLANTED = (Path(__file__).parent / "prove_me.py").read_text()


def prove_planted(tmp_path, *args):
    name = "prove_me.py"
    (tmp_path / name).write_text(PLANTED)
    line = PLANTED.splitlines().index("ds = ds.map(load)  # decoded in every epoch, one call at a time") + 1
    done = profile(tmp_path, "--json", "--logdir", "logs", "--prove", *args, "--", sys.executable, name, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), name, line, done.stderr


@pytest.mark.slow
def test_prove_applies_each_fix_at_the_line_measures_it_and_hands_over_a_patch_that_runs(tmp_path):
    document, name, line, stderr = prove_planted(tmp_path)
    proved = document["prove"]
    labels = {p["label"]: p for p in proved["each"]}
    assert {f"parallel calls at {name}:{line}", f"cache at {name}:{line}"} <= labels.keys(), proved
    for label in (f"parallel calls at {name}:{line}", f"cache at {name}:{line}"):
        found = labels[label]
        assert found["verdict"] in (PROVED, NO_GAIN, SLOWER, UNCLEAR), found  # measured, whatever it measured
        assert found["rounds"] == 3 and found["low"] <= found["gain"] <= found["high"]
    assert proved["together"]["fixes"] == ["parallel-calls", "cache"] or proved["together"]["verdict"] == NOT_PROVED
    assert proved["steps"][0] >= 6 and "round 3/3" in stderr and "prove: proving" in stderr
    first = document["runs"]["prove_me"]["recommendations"][0]
    assert first["built_at"]["line"] == line and first["proofs"][0]["label"] in labels
    assert json.loads((tmp_path / "logs" / "profile.json").read_text())["prove"] == proved
    assert (tmp_path / "logs" / "prove_me" / "proofs.json").is_file()
    if proved["patch"]:  # the proved fixes, written into a copy of the script
        copy = tmp_path / "patched"
        copy.mkdir()
        shutil.copy(tmp_path / name, copy / name)
        (copy / "images").symlink_to(tmp_path / "images")
        applied = subprocess.run(["git", "apply", proved["patch"]], cwd=copy, capture_output=True, text=True)
        assert applied.returncode == 0, applied.stderr
        ran = subprocess.run([sys.executable, name, "20"], cwd=copy, capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0 and ran.stdout.strip().endswith("trained"), ran.stderr[-2000:]
    assert (tmp_path / name).read_text() == PLANTED  # the user's file is never written


SHUFFLED_RECORDS = textwrap.dedent(
    """\
    import os
    import sys

    import keras
    import numpy as np
    import tensorflow as tf

    if not os.path.isdir("records"):
        os.makedirs("records")
        rng = np.random.default_rng(3)
        for f in range(24):
            with tf.io.TFRecordWriter(f"records/part-{f:02d}.tfrecord") as writer:
                for i in range(8):
                    jpeg = tf.io.encode_jpeg(rng.integers(0, 255, (56, 56, 3), dtype=np.uint8)).numpy()
                    feature = {
                        "jpeg": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[8 * f + i])),
                    }
                    writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    spec = {"jpeg": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        return tf.cast(tf.io.decode_jpeg(example["jpeg"], channels=3), tf.float32) / 255.0, example["label"] % 4


    ds = tf.data.TFRecordDataset(sorted(tf.io.gfile.glob("records/*.tfrecord"))).shuffle(64, seed=5).repeat()
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(16)
    layers = [keras.Input((56, 56, 3)), keras.layers.AveragePooling2D(4), keras.layers.Flatten(), keras.layers.Dense(4)]
    model = keras.Sequential(layers)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, steps_per_epoch=int(sys.argv[1]) if len(sys.argv) > 1 else 120, epochs=1, verbose=0)
    print("order", [round(float(x[0, 0, 0, 0]), 4) for x, _ in ds.take(30)])  # each batch's first image
    """
)


@pytest.mark.slow
def test_prove_caches_records_it_counts_below_a_shuffle_it_moves_and_the_patch_keeps_the_order(tmp_path):
    """TFRecords tf.data cannot count, shuffled with a seed and repeated before the decode: prove counts the records to
    place its window, tries the cache below the repeat and the shuffle (the shuffle moved after it), and the patch
    that moves them leaves a script that trains on the same examples in the same order."""
    name = "shuffled.py"
    (tmp_path / name).write_text(SHUFFLED_RECORDS)
    line = SHUFFLED_RECORDS.splitlines().index("ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(16)") + 1
    done = profile(tmp_path, "--json", "--logdir", "logs", "--prove", "--rounds", "2", "--", sys.executable, name)
    assert done.returncode == 0, done.stderr[-3000:]
    proved = json.loads(done.stdout)["prove"]
    cache = {p["label"]: p for p in proved["each"]}.get(f"cache at {name}:{line}")
    assert cache is not None and cache["verdict"] in (PROVED, NO_GAIN, SLOWER, UNCLEAR), proved  # applied, measured
    assert proved["steps"][0] >= 24 // 2 + 2  # after one pass: 192 records counted, 12 batches
    # the patch the trial's moves write (git apply), against the script as written: the same examples, in order
    source = tmp_path / name
    fix = {"name": "cache", "file": str(source), "line": line, "kind": "_ParallelMapDataset"}
    diff, notes = patch.unified_diff([{**fix, "below_repeat": True, "moved_shuffle": True}], tmp_path)
    assert notes == [] and ".cache().shuffle(64, seed=5).repeat().batch(16)" in diff
    copy = tmp_path / "patched"
    copy.mkdir()
    shutil.copy(source, copy / name)
    (copy / "records").symlink_to(tmp_path / "records")
    (copy / "fix.patch").write_text(diff)
    assert subprocess.run(["git", "apply", "fix.patch"], cwd=copy, capture_output=True).returncode == 0
    orders = []
    for where in (tmp_path, copy):
        ran = subprocess.run([sys.executable, name, "20"], cwd=where, capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, ran.stderr[-2000:]
        orders.append(ran.stdout.strip().splitlines()[-1])
    assert orders[0].startswith("order [") and orders[0] == orders[1]
    assert source.read_text() == SHUFFLED_RECORDS


@pytest.mark.long
def test_prove_on_the_planted_decode_map_proves_the_cache_and_not_the_parallel_calls(tmp_path):
    """The issue's first case: on 2 cores that the model shares, a sequential decode map gains little from parallel
    calls and several times from a cache; prove must measure that, whatever the estimates say."""
    document, name, line, _ = prove_planted(tmp_path, "--rounds", "4")
    labels = {p["label"]: p for p in document["prove"]["each"]}
    cache, calls = labels[f"cache at {name}:{line}"], labels[f"parallel calls at {name}:{line}"]
    assert cache["verdict"] == PROVED and cache["gain"] > 1.5, cache
    assert calls["gain"] < cache["gain"], (calls, cache)
    assert document["prove"]["patch"] and ".cache()" in open(document["prove"]["patch"]).read()


@pytest.mark.slow
def test_sigterm_during_the_trials_stops_them_and_reports_what_they_measured(tmp_path):
    name = "prove_me.py"
    (tmp_path / name).write_text(PLANTED)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [str(STEP_DOCTOR), "profile", "--json", "--logdir", "logs", "--prove", "--", sys.executable, name]
    parent = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = []
    for line in parent.stderr:  # the progress lines: stop once the second trial of the first round has begun
        said.append(line)
        if "round 1/3, " in line:
            break
    parent.send_signal(signal.SIGTERM)  # to the parent alone, as a supervisor sends it
    out, rest = parent.communicate(timeout=120)
    assert parent.returncode == 0, "".join(said) + rest[-3000:]  # the command's own status, from its own run
    proved = json.loads(out)["prove"]
    assert proved["stopped"] == "SIGTERM" and proved["aa"][0] is not None, proved
    assert not [p for p in psutil.process_iter(["cmdline"]) if name in " ".join(p.info["cmdline"] or [])]
