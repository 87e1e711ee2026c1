"""diagnose on real profiles: a slow pipeline, a fast one, the stock Keras callback's, one without steps, damaged ones.

The pipelines of users' own scripts, one planted cause each, are in tests/test_diagnose_corpus.py.
"""

import dataclasses
import json
import shutil
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from step_doctor import diagnose
from step_doctor.callbacks import StepTraceProfiler
from step_doctor.diagnose import command, input_causes, report, stages, structural, verdict
from step_doctor.diagnose.device import DeviceView
from step_doctor.diagnose.ranked_causes import recommendations
from step_doctor.diagnose.recommendation import Causes
from step_doctor.diagnose.wait_record import InputWait, Unmeasured
from step_doctor.errors import UserError
from tests import records
from tests.conftest import run_cli


def _model():
    """Three strided convolutions: a model a CPU runs about as fast as a GPU runs a real one."""
    inputs = keras.Input(shape=(16, 16, 3), dtype="uint8")
    x = keras.layers.Rescaling(1.0 / 255)(inputs)
    for width in (4, 8, 16):
        x = keras.layers.Conv2D(width, 3, strides=2, padding="same", activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(4)(keras.layers.GlobalMaxPooling2D()(x)))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _slow_dataset():
    def sleepy(index):
        time.sleep(0.01)
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


def profiles(test):
    """The tests that read the profiles below, which train models to make them: make test and the container-stack
    check run them, make test-fast (the two products side by side) leaves them out."""
    return pytest.mark.stack(pytest.mark.slow(test))


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    for name, dataset in (("slow", _slow_dataset()), ("fast", _fast_dataset())):
        _model().fit(
            dataset,
            steps_per_epoch=15,
            epochs=1,
            verbose=0,
            callbacks=[StepTraceProfiler(root / name, start_step=2, num_steps=10)],
        )
    for name, dataset in (("stock_fast", _fast_dataset()), ("stock_slow", _slow_dataset())):
        _model().fit(
            dataset,
            steps_per_epoch=15,
            epochs=1,
            verbose=0,
            callbacks=[keras.callbacks.TensorBoard(str(root / name), profile_batch=(2, 12))],
        )
    return root


@pytest.fixture(scope="module")
def no_steps(tmp_path_factory):
    """A profile of a few eager ops: no step, no tf.data input, so no input share."""
    logdir = tmp_path_factory.mktemp("no_steps")
    tf.profiler.experimental.start(str(logdir))
    for _ in range(3):
        tf.linalg.matmul(tf.ones((64, 64)), tf.ones((64, 64)))
    tf.profiler.experimental.stop()
    return logdir


@profiles
def test_slow_pipeline_is_input_bound_and_the_python_map_is_named(logs):
    item = diagnose.diagnose(logs / "slow").to_json()["runs"]["."]
    assert item["verdict"] == "input-bound" and not item["steps_inferred"]
    assert item["profile"]["steps"] >= 9  # the ten marked steps, less the ones xprof leaves out
    assert item["profile"]["input_bound_percent"] >= 50
    assert item["profile"]["slow_stages"][0]["stage"] == "MapAndBatch"  # never the Prefetch above it
    top = item["recommendations"][0]
    assert top["cause"] == "python-in-map", item["recommendations"]
    assert "num_parallel_calls" in top["fix"] and "GIL" in top["fix"] and top["estimated_gain"] > 1.05
    assert "MapAndBatch" in top["evidence"] and "%" in top["evidence"]


@profiles
def test_fast_pipeline_is_not_input_bound(logs):
    item = diagnose.diagnose(logs / "fast").to_json()["runs"]["."]
    assert item["verdict"] != "input-bound"
    assert item["profile"]["input_bound_percent"] < 5
    input_causes = {"python-in-map", "sequential-map", "heavy-map", "no-prefetch", "slow-stage"}
    assert not input_causes & {rec["cause"] for rec in item["recommendations"]}


@profiles
def test_stock_callback_profiles_get_an_inferred_verdict(logs):
    result = diagnose.diagnose(logs)
    fast, slow = result.runs["stock_fast/train"], result.runs["stock_slow/train"]
    assert fast.steps_inferred and slow.steps_inferred
    assert "No step marker" in " ".join(fast.profile.diagnostics)  # xprof's own view: no step time
    assert fast.verdict != "input-bound" and fast.profile.input_bound_percent < 5
    assert slow.verdict == "input-bound" and slow.recommendations[0].cause == "python-in-map"
    marked = result.runs["slow"].profile.input_bound_percent
    assert abs(slow.profile.input_bound_percent - marked) <= 10
    assert "StepTraceProfiler" in slow.how_to_capture
    text = diagnose.render(result)
    assert "INPUT-BOUND (inferred steps)" in text and "Profiled batch events" in text


@profiles
def test_several_runs_get_one_summary_line_each_then_details(logs):
    text = diagnose.render(diagnose.diagnose(logs))
    head = text.split("\n\n")[0].splitlines()
    assert [line.split(":")[0] for line in head] == ["fast", "slow", "stock_fast/train", "stock_slow/train"]
    assert "INPUT-BOUND" in head[1] and "python-in-map" in head[1]
    assert text.count("== ") == 4


@profiles
def test_cores_the_profile_does_not_record_are_said_to_be_unknown(logs):
    """tf.data records its cores on the Root iterator (cpu_budget, threadpool_size); where a profile lacks them
    (another TensorFlow, a capture without the Root's events), estimates must not claim the profile said so."""
    profile = diagnose.diagnose(logs / "slow").runs["."].profile
    assert profile.wait.cpu_budget  # this machine's profile records them
    unknown = dataclasses.replace(profile, wait=dataclasses.replace(profile.wait, cpu_budget=None))
    known_first, unknown_first = recommendations(profile)[0], recommendations(unknown)[0]
    assert known_first.cause == unknown_first.cause == "python-in-map"
    assert "given in this profile" in known_first.caveat and "cores unknown" not in known_first.caveat
    assert "cores unknown" in unknown_first.caveat and "given in this profile" not in unknown_first.caveat


def _claimed_gpu(logs, tmp_path, name):
    """A real CPU profile in a run folder whose summary.json says it trained on a GPU, as a GPU run in a container
    without profiling rights leaves it: CUPTI refused, so the profile holds host events only."""
    run = tmp_path / name
    shutil.copytree(logs / name, run)
    (run / "summary.json").write_text(json.dumps({"device_kind": "gpu", "device": "1x GPU (NVIDIA H100 80GB HBM3)"}))
    return run


@profiles
def test_a_gpu_run_without_device_trace_says_why_and_how_to_fix_it(logs, tmp_path):
    claimed = diagnose.diagnose(_claimed_gpu(logs, tmp_path, "fast"))
    fast = claimed.runs["."]
    assert fast.verdict == "not-input-bound"  # not "device-bound" from the host's figures
    assert not fast.device.cpu_only and fast.device.busy_percent is None
    assert "H100" in fast.device.unmeasured and "SYS_ADMIN" in fast.device.unmeasured
    assert "NVreg_RestrictProfilingToAdminUsers=0" in fast.device.unmeasured
    text = diagnose.render(claimed)
    assert "device busy: not measured" in text and "CPU-only" not in text and "No device trace" in text
    slow = diagnose.diagnose(_claimed_gpu(logs, tmp_path, "slow")).runs["."]
    assert slow.verdict == "input-bound"  # the input wait comes from host events and stands
    assert slow.recommendations[0].cause == "python-in-map"


@profiles
def test_a_device_plane_without_events_is_no_device_busy_figure_of_zero(logs, tmp_path):
    """A profile whose own metadata names a GPU (a /device:GPU:0 plane, as the GPU tracer adds one) without a
    single device event: xprof calls it a GPU profile with no device compute; diagnose must not report 0 % busy."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    run = tmp_path / "gpu_plane"
    shutil.copytree(logs / "fast", run)
    xplane = next(run.rglob("*.xplane.pb"))
    for cached in xplane.parent.iterdir():
        if cached != xplane:
            cached.unlink()  # xprof's conversion caches, made from the profile before the plane was added
    space = xplane_pb2.XSpace.FromString(xplane.read_bytes())
    plane = space.planes.add()
    plane.id, plane.name = max(p.id for p in space.planes) + 1, "/device:GPU:0"
    xplane.write_bytes(space.SerializeToString())
    result = diagnose.diagnose(run)
    item = result.runs["."]
    assert item.profile.hardware_type == "GPU" and item.profile.device_busy_percent == 0.0
    assert item.verdict == "not-input-bound" and item.device.busy_percent is None
    assert "CUPTI" in item.device.unmeasured
    assert "model-too-small" not in {r.cause for r in item.recommendations}
    assert "device busy: not measured" in diagnose.render(result)


@profiles
def test_the_profilers_own_errors_reach_the_diagnosis(logs, tmp_path):
    """TensorFlow writes what went wrong while capturing into the profile (XSpace errors), e.g. CUPTI refusing a
    non-root process the GPU trace (the text of TF's CuptiTracer::ErrorIfAny). Without summary.json, that error alone
    tells a GPU run whose device trace was refused from a CPU-only one, and the diagnosis quotes it."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from step_doctor.diagnose import xspace

    refused = "vm: Insufficient privilege to run libcupti (you need root permission)."
    run = tmp_path / "refused"
    shutil.copytree(logs / "fast", run)
    xplane = next(run.rglob("*.xplane.pb"))
    for cached in xplane.parent.iterdir():
        if cached != xplane:
            cached.unlink()
    space = xplane_pb2.XSpace.FromString(xplane.read_bytes())
    space.errors.append(refused)
    space.warnings.append("cupti activity buffer full")
    xplane.write_bytes(space.SerializeToString())
    with xspace.XSpaceFile(xplane) as read:
        assert (read.errors, read.warnings, read.hostnames) == (list(space.errors), list(space.warnings), ["vm"])
    result = diagnose.diagnose(run)
    item = result.runs["."]
    assert item.profile.profiler_errors == (refused,)
    assert item.profile.profiler_warnings == ("cupti activity buffer full",)
    assert not item.device.cpu_only and item.verdict == "not-input-bound"
    assert refused in item.device.unmeasured and "SYS_ADMIN" in item.device.unmeasured
    assert refused in diagnose.render(result)
    plain = diagnose.diagnose(logs / "fast").runs["."]  # the same profile without the error: CPU-only
    assert plain.profile.profiler_errors == () and plain.device.cpu_only


def test_only_far_out_time_of_a_millisecond_or_more_is_taken_for_a_stall():
    """Per step, the caller's time by the event it was in: the one step stopped for 150 ms in the same event as the
    others is a stall; jitter, microseconds in events only some steps have, and fewer than five steps are not. What
    of it passed while the input pipeline ran stays in the step (its threads held the cores)."""
    from step_doctor.diagnose import stalls

    n = 11
    times = [{"train": 100.0, "dispatch": 200.0 + 20 * (i % 3), "rare": 30.0 * (i in (2, 7))} for i in range(n)]
    times[5]["train"] += 150_000.0
    caller = [{label: (t, 0.0) for label, t in c.items()} for c in times]
    caller[5]["train"] = (times[5]["train"], times[5]["train"] / 3)  # the pipeline ran in a third of it
    step = [sum(c.values()) + 1000.0 for c in times]
    compute = [500.0] * n
    compute[8] = 40_500.0  # the model's same ops, 40 ms longer in one step: stopped inside an op
    step[8] += 40_000.0
    no_gaps = ([0.0] * n, [0.0] * n)
    found = stalls.split(step, [500.0] * n, compute, no_gaps, caller)
    assert found.stretched_steps == 2
    assert found.stall_us[5] == pytest.approx(150_000.0) and found.stall_us[8] == pytest.approx(40_000.0)
    assert sum(found.stall_us) == pytest.approx(190_000.0)
    assert found.compute_stretched_ms == pytest.approx(40.0 / n, abs=1e-3)
    assert found.pipeline_ms == pytest.approx(50.0 / n, abs=1e-2)
    few = stalls.split(step[:4], [500.0] * 4, compute[:4], ([0.0] * 4, [0.0] * 4), caller[:4])
    assert few.stall_ms == 0.0 and few.stretched_steps == 0
    gaps = stalls.split(step, [500.0] * n, [500.0] * n, ([1500.0] * n, [500.0] * n), [{}] * n)  # from activity.py
    assert (gaps.stall_ms, gaps.gaps_ms, gaps.pipeline_ms) == pytest.approx((1.5, 1.5, 0.5))
    assert gaps.record() == stalls.Stall(gaps_ms=1.5, pipeline_ms=0.5, stretched_steps=0, stretched_ms=0.0)
    wait = records.wait(step_ms=10.0, stall_ms=1.5, stall=gaps.record())
    assert (stalls.working_step(wait), stalls.left_out(wait)) == pytest.approx((9.0, 1.0))


def test_folder_without_profiles_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="No TensorBoard profile"):
        diagnose.diagnose(tmp_path)
    stray = tmp_path / "plugins" / "profile" / "2026_01_01_00_00_00"
    stray.mkdir(parents=True)
    (stray / "host.trace.json.gz").write_bytes(b"old format")
    with pytest.raises(UserError, match="host.trace.json.gz"):
        diagnose.diagnose(tmp_path)


@profiles
def test_cli_json_and_the_regression_guard(logs):
    result = run_cli("diagnose", str(logs), "--json", "--fail-if-input-bound", "20", timeout=120)
    assert result.returncode == 3, result.stderr
    parsed = json.loads(result.stdout)
    assert parsed["runs"]["slow"]["verdict"] == "input-bound"
    rec = parsed["runs"]["slow"]["recommendations"][0]
    assert {"cause", "score", "estimated_gain", "evidence", "fix"} <= set(rec)
    failing = result.stderr.split("of step time:")[1]
    assert "slow" in failing and "stock_slow/train" in failing and "fast" not in failing
    passing = run_cli("diagnose", str(logs / "fast"), "--fail-if-input-bound", "20", timeout=120)
    assert passing.returncode == 0 and "verdict:" in passing.stdout


@profiles
def test_the_gate_fails_a_run_at_exactly_its_threshold_as_the_verdict_calls_it(logs, capsys):
    """The verdict calls a share at the threshold input-bound: the gate at that share must fail the run too."""
    profile = diagnose.diagnose(logs / "slow").runs["."].profile
    share = profile.input_bound_percent
    assert verdict.verdict(dataclasses.replace(profile, input_bound_percent=verdict.INPUT_BOUND)) == "input-bound"
    assert command.main(str(logs / "slow"), fail_if_input_bound=share) == command.INPUT_BOUND
    assert f"({share:.1f}%)" in capsys.readouterr().err
    assert command.main(str(logs / "slow"), fail_if_input_bound=share + 0.1) == 0


@profiles
def test_the_gate_never_passes_what_it_could_not_measure(no_steps):
    item = diagnose.diagnose(no_steps).runs["."]
    assert item.verdict == "unknown" and item.profile.input_bound_percent is None
    gated = run_cli("diagnose", str(no_steps), "--fail-if-input-bound", "20", timeout=120)
    assert gated.returncode == command.UNMEASURED, gated.stdout + gated.stderr
    assert "could not measure" in gated.stderr and "no training steps" in gated.stderr
    allowed = run_cli("diagnose", str(no_steps), "--fail-if-input-bound", "20", "--allow-unmeasured", timeout=120)
    assert allowed.returncode == 0
    assert run_cli("diagnose", str(no_steps), timeout=120).returncode == 0  # no gate: a diagnosis, limits said


def _damaged(logs, root):
    """One run per kind of damage, each made from the fast run's good profile."""
    good = next((logs / "fast").rglob("*.xplane.pb")).read_bytes()
    flipped = bytearray(good)
    for i in range(64):
        flipped[i] ^= 0xFF
    contents = {
        "truncated": good[: len(good) // 2],
        "bit_flipped": bytes(flipped),
        "empty": b"",
        "wrong_file": b"\x89PNG\r\n\x1a\n" + bytes(200),
    }
    paths = {}
    for name, data in contents.items():
        session = root / name / "plugins" / "profile" / "2026_01_01_00_00_00"
        session.mkdir(parents=True)
        (session / "host.xplane.pb").write_bytes(data)
        paths[name] = session / "host.xplane.pb"
    folder = root / "folder" / "plugins" / "profile" / "2026_01_01_00_00_00" / "host.xplane.pb"
    folder.mkdir(parents=True)
    paths["folder"] = folder
    return paths


@profiles
def test_damaged_profiles_get_one_paragraph_naming_the_file_and_fail_the_gate(logs, tmp_path):
    paths = _damaged(logs, tmp_path)
    result = diagnose.diagnose(tmp_path)
    for name, path in paths.items():
        item = result.runs[name]
        assert item.verdict == "unreadable", name
        assert str(path) in item.error and "\n" not in item.error, item.error
    cli = run_cli("diagnose", str(tmp_path), "--fail-if-input-bound", "20", timeout=120)
    assert cli.returncode == command.UNMEASURED
    assert "Traceback" not in cli.stdout + cli.stderr
    assert all(str(path) in cli.stdout for path in paths.values())
    # one damaged run among good ones still fails the gate, and plain diagnose says so by its status too
    shutil.copytree(logs / "fast", tmp_path / "good")
    assert run_cli("diagnose", str(tmp_path)).returncode == command.UNMEASURED


def test_a_wait_whose_producers_left_no_events_is_called_out():
    """TF 2.17 drops the events of finished epochs' tf.data threads: the wait then sits on a pass-through stage."""

    def profile(unattributed_ms):
        stages = (
            records.stage("Iterator::Root::Prefetch", "Prefetch", pass_through=True, blocking_ms=unattributed_ms),
            records.stage("Iterator::Root::Prefetch::Shuffle", "Shuffle", blocking_ms=8 - unattributed_ms),
        )
        wait = records.wait(step_ms=10.0, input_ms=8.0, unattributed_ms=unattributed_ms, stages=stages)
        return records.profile(wait, device_busy_percent=50.0)

    gpu = DeviceView(cpu_only=False, busy_percent=50.0, unmeasured=None)
    (note,) = report.notes(profile(3.0), gpu)
    assert note.startswith("Unseen producers") and "3.0 ms of the 8.0 ms" in note and "Iterator::Root::Prefetch" in note
    assert report.notes(profile(0.5), gpu) == []


def _stage(path, kind, blocking_ms=0.0, fn_ms=None):
    functions = records.functions(wall_ms=fn_ms) if fn_ms is not None else None
    return records.stage(path, kind, blocking_ms=blocking_ms, functions=functions)


def test_the_wait_on_a_strategys_hand_off_generator_goes_to_the_pipeline_that_feeds_it():
    """experimental_distribute_dataset: the step waits on the MultiDeviceIterator's generator, the user's beside."""
    hand_off = _stage("Iterator::Root::Prefetch::Generator", "Generator", blocking_ms=28.6, fn_ms=0.2)
    theirs = [
        _stage("Iterator::Root::Prefetch::Rebatch", "Rebatch"),
        _stage("Iterator::Root::Prefetch::Rebatch::BatchV2::FlatMap", "FlatMap"),
        _stage("Iterator::Root::Prefetch::Rebatch::BatchV2::FlatMap::Generator", "Generator", fn_ms=34.9),
    ]
    (unit,) = stages.units([hand_off, *theirs])
    assert unit.head is theirs[-1] and unit.blocking_ms == 28.6
    # a generator whose own Python explains its wait is the cause itself
    busy = _stage("Iterator::Root::Prefetch::Generator", "Generator", blocking_ms=28.6, fn_ms=25.0)
    assert stages.units([busy, *theirs])[0].head is busy


@pytest.mark.parametrize(
    "shapes, types, ids",
    [
        ("[512] []", "int32 int32", "[512] int32"),  # a generator's padded token ids and a label
        ("[?] []", "int64 float", "[?] int64"),  # a tokenizing map's ids, unpadded, and a float label
        ("[32,?] [32]", "int32 int32", "[32,?] int32"),  # batched (a map-and-batch)
        ("[?,128] [?,128] [?]", "int32 int32 int64", "[?,128] int32"),  # ids and a mask
        ("[64,64,3] []", "uint8 int64", None),  # an image
        ("[10] []", "int64 int64", None),  # a few integer features: not a sequence
        ("[512] [512]", "int32 float", None),  # a float vector as long as the ids: cannot tell
        ("[?] [?]", "int32 int32", "[?] int32"),  # ids and a mask, no label (a language model's input)
        ("[?,?] [?]", "int32 float", "[?,?] int32"),  # a padded batch and its labels
        ("<unknown> []", "int32 int32", None),  # shapes not recorded
        ("", "", None),
    ],
)
def test_token_ids_are_read_from_the_element_shapes_only_where_they_can_only_be_that(shapes, types, ids):
    stage = records.stage("Iterator::Root::Map", "Map", params={"shapes": shapes, "types": types} if shapes else {})
    assert stages.token_ids(stage) == ids


def _padded_wait(
    batch_shapes: str, fed_shapes: str, path: str = "Iterator::Root::Prefetch::PaddedBatchV2"
) -> InputWait:
    def stage(at, kind, shapes, **params):
        return records.stage(at, kind, params={"shapes": shapes, "types": "int32 int32", **params})

    padded = stage(path, "PaddedBatchV2", batch_shapes, batch_size="32")
    fed = stage(path + "::FlatMap", "FlatMap", fed_shapes)
    return records.wait(step_ms=10.0, input_ms=1.0, compute_ms=6.0, stages=(padded, fed))


def test_a_padded_batch_is_a_structural_fix_only_where_it_pads_without_buckets():
    """To a fixed length or to each batch's longest: listed; under bucket_by_sequence_length (GroupByWindow), or fed
    elements of one shape (nothing to pad): not. A recorded padding share prices it on the model's compute."""
    (fixed,) = structural.unbucketed_padding(_padded_wait("[32,512] [32]", "[?] []"), None)
    assert "to a fixed length (512)" in fixed.evidence and "padding share unknown" in fixed.evidence
    assert fixed.removes_ms == 0.0 and "bucket_by_sequence_length" in fixed.fix
    (longest,) = structural.unbucketed_padding(_padded_wait("[32,?] [32]", "[?] []"), 0.5)
    assert "longest sequence of each batch" in longest.evidence and "padding share of 50%" in longest.evidence
    assert longest.removes_ms == pytest.approx(3.0) and "compile the step again" in longest.evidence
    bucketed = "Iterator::Root::Prefetch::GroupByWindow::PaddedBatchV2"
    assert not structural.unbucketed_padding(_padded_wait("[32,64] [32]", "[?] []", path=bucketed), None)
    assert not structural.unbucketed_padding(_padded_wait("[32,128] [32]", "[128] []"), None)
    assert structural.padding_share({"text": {"padding_share": 0.25}}) == 0.25
    assert structural.padding_share({"padding_share": 25}) is None and structural.padding_share({}) is None


def _tree_stage(path, kind, functions=None, **params):
    return records.stage(
        path,
        kind,
        ops=(f"{kind}Dataset:1",),
        params=params,
        asynchronous=kind == "Prefetch",
        pass_through=kind in ("Root", "Prefetch"),
        blocking_ms=2.0 if kind == "Generator" else 0.0,
        functions=functions,
    )


def test_python_tokenization_in_a_run_that_does_not_wait_for_it_is_a_latent_note():
    """A slow model in front of a Python tokenizer (the template's naive text run on a CPU): the generator costs
    little here, and would hold the step where the model is faster: a latent note that names it."""
    python = records.functions(calls_per_step=32, work_ms=10.0, wall_ms=9.0, concurrency=1.1, threads=2)
    python = dataclasses.replace(python, ops_ms={"python": 8.0}, top_ops=(("PyFunc", 8.0),))
    root = "Iterator::Root::Prefetch::BatchV2"
    tree = [
        _tree_stage("Iterator::Root", "Root"),
        _tree_stage("Iterator::Root::Prefetch", "Prefetch"),
        _tree_stage(root, "BatchV2", batch_size="32", shapes="[?,?] [?]", types="int32 int32"),
        _tree_stage(root + "::FlatMap", "FlatMap", shapes="[?] []", types="int32 int32"),
        _tree_stage(root + "::FlatMap::Generator", "Generator", python, shapes="[?] []", types="int32 int32"),
    ]
    wait = records.wait(step_ms=200.0, input_ms=2.0, cpu_budget=2, stages=tuple(tree))
    (note,) = structural.latent_fixes(wait, cpu_only=True, listed=[])
    assert note.cause == "python-tokenization" and note.kind == "latent" and note.stage.endswith("Generator")
    assert "[?] int32: token ids" in note.evidence and "tokenized once" in note.if_faster
    image = tuple(
        dataclasses.replace(s, params={**s.params, "shapes": "[64,64,3] []", "types": "uint8 int64"}) for s in tree
    )
    assert not structural.latent_fixes(dataclasses.replace(wait, stages=image), cpu_only=True, listed=[])


def test_a_shuffle_buffer_filled_from_python_tokenization_says_to_tokenize_once():
    python = records.functions(calls_per_step=100, work_ms=38.0, wall_ms=35.0, concurrency=1.1, threads=2)
    python = dataclasses.replace(python, ops_ms={"python": 31.0}, top_ops=(("PyFunc", 31.0),))
    at = "Iterator::Root::PaddedBatchV2::Shuffle"
    shuffle = _tree_stage(at, "Shuffle", buffer_size="1000", shapes="[?] []", types="int32 int32")
    shuffle = dataclasses.replace(shuffle, fill_ms=36.0, fills=1, pulled_per_fill=1000, element_mb=None)
    tokens = _tree_stage(at + "::FlatMap::Generator", "Generator", python, shapes="[?] []", types="int32 int32")
    wait = records.wait(step_ms=320.0, input_ms=44.0, cpu_budget=2, stages=(shuffle, tokens))
    causes = Causes(320.0)
    input_causes.input_causes(wait, cpu_only=True, causes=causes)
    (refill,) = [r for r in causes.found if r.cause == "shuffle-buffer-refill"]
    assert "from Python tokenization" in refill.title and "[?] int32: token ids" in refill.evidence
    assert "TextVectorization" in refill.fix and refill.removes_ms == 36.0


@profiles
def test_the_input_wait_is_read_by_attribute_and_written_as_the_documents_input_pipeline(logs):
    """The document's input_pipeline is the record's to_json, keys in order; a misspelt figure is an error."""
    result = diagnose.diagnose(logs / "slow")
    written = result.to_json()["runs"]["."]["profile"]["input_pipeline"]
    record = result.runs["."].profile.wait
    assert isinstance(record, InputWait) and record.measured and record.device is None
    assert list(record.to_json()) == list(written) and json.dumps(record.to_json()) == json.dumps(written)
    with pytest.raises(AttributeError):
        record.input_wait_ms  # noqa: B018
    with pytest.raises(TypeError):
        dataclasses.replace(record, inptu_ms=1.0)
    none = Unmeasured("the profile shows no training steps")
    assert none.to_json() == {"measured": False, "reason": none.reason}
    with pytest.raises(AttributeError):
        none.step_ms  # noqa: B018
