"""The doctor on JAX-made profiles: Keras 3 on the JAX backend and plain JAX loops (tests/jax_pipelines.py).

The corpus is recorded once, in a process of its own (KERAS_BACKEND=jax must come before Keras), as `step-doctor
profile` captures JAX (jax_capture.py): JAX's profiler, TensorFlow's beside it where tf.data feeds the steps. The
diagnosis itself needs no JAX: it reads the files.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from step_doctor.diagnose import diagnose, render
from tests.conftest import DOCTOR, STEP_DOCTOR

pytest.importorskip("jax", reason="JAX is not installed (make setup installs jax[cpu]; the container stack has none)")

CORPUS = DOCTOR / "tests" / "jax_pipelines.py"
pytestmark = pytest.mark.slow


def line_of(function: str) -> int:
    """Where a corpus function is defined: the line the doctor must name."""
    tree = ast.parse(CORPUS.read_text())
    return next(node.lineno for node in ast.walk(tree) if getattr(node, "name", None) == function)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("jax-corpus")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, str(CORPUS), "--record", str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=DOCTOR,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def run_of(corpus: Path, case: str):
    diagnosis = diagnose(corpus / case)
    assert render(diagnosis).startswith(".: ")  # the text report of every case, as `step-doctor diagnose` prints it
    (run,) = diagnosis.runs.values()
    return run


def test_keras_on_jax_fed_by_a_sequential_decode_map_is_input_bound_with_the_map_named_first(corpus):
    run = run_of(corpus, "keras_tfdata_decode_every_step")
    assert run.verdict == "input-bound", run.profile.input_bound_percent
    first = run.recommendations[0]
    assert first.stage and "MapAndBatch" in first.stage, [(r.cause, r.stage) for r in run.recommendations]
    assert first.cause in ("sequential-map", "decode-every-epoch", "heavy-map")
    wait = run.profile.wait
    assert wait.jax.tf_data and wait.stages and run.profile.step_source == "step markers"
    document = json.loads(json.dumps(diagnose(corpus / "keras_tfdata_decode_every_step").to_json()))
    assert document["runs"]["."]["profile"]["input_pipeline"]["jax"]["function"] == "PjitFunction(train_step)"


def test_the_same_script_with_a_parallel_cached_prefetched_pipeline_is_not_input_bound(corpus):
    run = run_of(corpus, "keras_tfdata_fine")
    assert run.verdict != "input-bound" and run.profile.input_bound_percent < 20, run.profile.input_bound_percent


def test_a_plain_jax_loop_fed_by_a_python_generator_gets_its_python_input_named_with_its_line(corpus):
    run = run_of(corpus, "jax_loop_python_generator")
    assert run.verdict == "input-bound" and run.steps_inferred
    first = run.recommendations[0]
    assert first.cause == "python-input", [r.cause for r in run.recommendations]
    assert first.stage == f"jax_pipelines.py:{line_of('python_batches')}", first.stage
    assert run.profile.wait.function == "PjitFunction(sgd_step)"  # the step, not an op dispatched by the generator


def test_a_grain_map_on_the_training_thread_is_named_at_the_users_map_function(corpus):
    run = run_of(corpus, "jax_loop_grain")
    assert run.verdict == "input-bound"
    first = run.recommendations[0]
    assert first.cause == "python-input" and first.stage == f"jax_pipelines.py:{line_of('grain_normalize')}"
    assert "mp_prefetch" in first.fix and "worker_count" in first.fix


def test_step_markers_in_a_jax_loop_give_its_steps(corpus):
    run = run_of(corpus, "jax_loop_python_generator_marked")
    assert run.profile.step_source == "step markers" and not run.steps_inferred
    assert run.recommendations[0].cause == "python-input"


def test_a_pydataset_that_builds_batches_in_python_is_named_at_its_getitem(corpus):
    run = run_of(corpus, "keras_pydataset_python")
    assert run.verdict == "input-bound"
    first = run.recommendations[0]
    assert first.cause == "python-input" and first.stage == f"jax_pipelines.py:{line_of('__getitem__')}"


def test_a_jitted_step_whose_batch_shape_changes_every_step_gets_recompilation(corpus):
    run = run_of(corpus, "jax_loop_shape_churn")
    first = run.recommendations[0]
    assert first.cause == "recompilation", [r.cause for r in run.recommendations]
    xla = run.profile.wait.xla
    assert xla.churn and xla.compiles >= xla.steps - 1
    assert "static" in first.fix and "jax" in first.fix.lower()


def test_batches_placed_on_the_device_before_training_are_not_input(corpus):
    run = run_of(corpus, "jax_loop_device_resident")
    assert run.verdict != "input-bound" and run.profile.input_bound_percent < 5
    assert "python-input" not in [r.cause for r in run.recommendations]


def test_the_diagnosis_of_a_jax_profile_needs_no_jax(corpus, tmp_path):
    """A doctor installed where JAX is not (a CPU box reading a GPU host's profile): the same answer."""
    (tmp_path / "jax.py").write_text("raise ImportError('no JAX here')\n")
    code = (
        "import json, sys\nfrom step_doctor.diagnose import diagnose as d; print(json.dumps(d(sys.argv[1]).to_json()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(corpus / "jax_loop_python_generator")],
        capture_output=True,
        text=True,
        cwd=DOCTOR,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}:{DOCTOR}"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["runs"]["."]["recommendations"][0]["cause"] == "python-input"


@pytest.mark.parametrize(
    "pause",
    [
        # JAX's compiles are Keras building the model; fit comes 8 s later, well after profile's plain-loop window
        # (1 s of quiet, the profilers' start, 2 s) has been captured: fit's own replaces it (retake_for_fit)
        8.0,
        # fit at once, inside the quiet before a plain-loop window (the path most scripts take; long: CI runs one)
        pytest.param(0.0, marks=pytest.mark.long),
    ],
)
def test_profile_captures_keras_on_jax_unchanged_with_tf_data_stages(tmp_path, pause):
    """`step-doctor profile` on the script as a user runs it: JAX's profiler over Keras fit's steps, TensorFlow's
    beside it for tf.data's stages, one verdict."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [
            str(STEP_DOCTOR),
            "profile",
            "--json",
            "--logdir",
            "logs",
            "--",
            sys.executable,
            str(CORPUS),
            "keras_tfdata_decode_every_step",
            "--pause-before-fit",
            str(pause),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    (process,) = document["capture"]["processes"]
    assert process["capture"]["profiler"] == "jax" and process["capture"]["state"] == "done", process
    assert process["mode"] == "keras-fit" and process["window"]["steps"] == [5, 16], process
    retaken = [note for note in process["notes"] if "fit's steps are captured instead" in note]
    assert len(retaken) == 1 or not pause, process["notes"]  # with no pause, a slow machine may retake too
    (run,) = document["runs"].values()
    assert run["verdict"] == "input-bound", run["profile"]["input_bound_percent"]
    assert "MapAndBatch" in (run["recommendations"][0]["stage"] or "")
    session = Path(run["profile"]["session"])
    assert [p.name for p in session.parent.iterdir()] == [session.name]  # the plain-loop capture is gone
    assert len(list(session.glob("*-tensorflow.xplane.pb"))) == len(list(session.glob("*.xplane.pb"))) - 1 == 1


def test_the_diagnose_tab_shows_a_jax_run_like_any_other(corpus):
    from tests.tab_logs import app, diagnosed

    _, client = app(corpus)
    found = diagnosed(client, "jax_loop_python_generator")
    assert found["state"] == "done", found
    item = found["diagnosis"]
    assert item["verdict"] == "input-bound" and item["recommendations"][0]["cause"] == "python-input"
    assert found["text"].startswith("jax_loop_python_generator: INPUT-BOUND")


@pytest.mark.long
def test_profile_captures_a_plain_jax_loop_over_a_time_window(tmp_path):
    """No Python code sees a jitted function's calls: the window starts once JAX's compiles have settled."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [
            str(STEP_DOCTOR),
            "profile",
            "--json",
            "--logdir",
            "logs",
            "--",
            sys.executable,
            str(CORPUS),
            "jax_loop_python_generator",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    (process,) = document["capture"]["processes"]
    assert process["mode"] == "jax-loop" and process["capture"]["profiler"] == "jax", process
    (run,) = document["runs"].values()
    assert run["verdict"] == "input-bound" and run["recommendations"][0]["cause"] == "python-input"


def test_a_fit_too_short_for_its_window_keeps_the_plain_loop_capture(tmp_path):
    """The retake's other end: a fit that begins after a plain-loop capture but ends before its own window begins
    leaves that capture, its session and its status, as the run's (the capture object as a profiled process holds
    it, driven through the transitions a JAX script makes)."""
    from step_doctor.profile.site.capture import Capture

    capture = Capture({"steps": None, "status_dir": str(tmp_path), "logdir": str(tmp_path)})
    session = tmp_path / "main" / "plugins" / "profile" / "2026_12_06_06_00_00"
    session.mkdir(parents=True)
    loop = {"state": "done", "profiler": "jax", "at": "1.0 s after JAX's first compile"}
    capture.status.update(run="main", mode="jax-loop", window={"seconds": 2.0}, capture=loop)
    capture.state, capture.last_session, capture.compiles = "done", str(session), [time.time() - 6]

    with capture.lock:  # as keras_fit's fit_with_capture calls it
        capture.retake_for_fit()
    assert capture.state == "waiting" and "fit's steps are captured instead" in capture.status["notes"][-1]
    capture.status.update(mode="keras-fit")  # what fit_with_capture sets next; its window never begins
    capture.at_exit()

    saved = json.loads((tmp_path / f"{capture.pid}.json").read_text())
    assert saved["mode"] == "jax-loop" and saved["capture"] == loop and saved["window"] == {"seconds": 2.0}, saved
    assert "the plain-loop capture is kept" in saved["notes"][-1] and session.is_dir()


@pytest.mark.parametrize("mode, opens", [("keras-fit", False), ("jax-loop", True)])
def test_a_prove_trial_opens_a_plain_loop_window_only_for_a_plain_loop(tmp_path, mode, opens):
    """A trial of `profile --prove` times the window the profile had: for a script profiled as Keras fit, JAX's
    compiles (Keras building its model) must not start a plain-loop window that would end the trial before fit."""
    from step_doctor.profile.site import jax_capture
    from step_doctor.profile.site.capture import Capture

    trial = {"fixes": [], "mode": mode}
    capture = Capture({"steps": [6, 20], "status_dir": str(tmp_path), "logdir": str(tmp_path), "trial": trial})
    capture._on_jax_event(f"/jax/compilation_cache/{jax_capture.COMPILED}", 0.1)
    time.sleep(jax_capture.START_AFTER_S + 0.5)
    state = capture.state
    capture.state = "done"  # the window's thread then ends without end(): a trial's end leaves the process
    for thread in threading.enumerate():
        if thread.name == "profile-jax-window":
            thread.join(timeout=5)
    assert state == ("active" if opens else "waiting"), capture.status
