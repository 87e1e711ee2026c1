"""`profile -- COMMAND`: the command runs as it would alone, the capture is injected, failures are one paragraph.

Every test runs the CLI as a user would (the console script, from a folder outside the repository)
on a script written for the test; the scripts import nothing of this project. Commands that never
import TensorFlow are fast; those that train pay TensorFlow's import in the child (5-7 s here).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from step_doctor.errors import UserError
from step_doctor.profile import runner
from tests.conftest import STEP_DOCTOR

FIT = """
import sys
import numpy as np
import tensorflow as tf
import keras

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
x = np.random.default_rng(0).random((512, 8), dtype=np.float32)
ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(16).repeat()
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)
print("my script's own output")
"""


def profile(tmp_path: Path, *args: str, timeout: float = 300, env: dict | None = None, **kwargs):
    """`step-doctor profile ARGS` in tmp_path, as a user runs it (no PYTHONPATH pointing at the project)."""
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(STEP_DOCTOR), "profile", *args],
        cwd=tmp_path,
        env={**clean, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def script(tmp_path: Path, body: str, name: str = "my_train.py") -> str:
    (tmp_path / name).write_text(textwrap.dedent(body))
    return name


def error_paragraph(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr[-3000:]
    return errors[0]


# ---- fast: commands that never import TensorFlow -------------------------------------------------------------


@pytest.mark.parametrize("text", ["5", "5-6", "a-b", "9-3", "-1-5"])
def test_a_window_that_cannot_give_a_verdict_is_refused(text):
    with pytest.raises(UserError, match="--steps"):
        runner.parse_steps(text)
    assert runner.parse_steps("5-16") == (5, 16) and runner.parse_steps(None) is None


def test_a_command_that_is_not_python_is_one_paragraph_and_leaves_nothing(tmp_path):
    done = profile(tmp_path, "--logdir", "logs", "--", "ls", "-a")
    assert done.returncode == 2
    assert "." in done.stdout.split()  # ls ran as it would alone
    paragraph = error_paragraph(done.stderr)
    assert "`ls -a` exited with status 0 after" in paragraph and "not a Python command" in paragraph
    assert not (tmp_path / "logs").exists()


PROBE = """
import os, signal, time
time.sleep(0.5)  # profile's loop has begun
def held(pid, tid):
    status = open(f"/proc/{pid}/task/{tid}/status").read()
    mask = int(status.split("SigBlk:")[1].split()[0], 16)
    return [s.name for s in (signal.SIGINT, signal.SIGTERM) if mask >> (s - 1) & 1]
parent = os.getppid()
others = [tid for tid in os.listdir(f"/proc/{parent}/task") if tid != str(parent)]
print("threads", len(others), sorted({tuple(held(parent, tid)) for tid in others}))
print("command", held(os.getpid(), os.getpid()))
"""


def test_every_thread_of_profile_holds_what_it_forwards_and_the_command_starts_without_that(tmp_path):
    """profile takes SIGINT and SIGTERM in its main thread's sigtimedwait loop and forwards them: another thread of
    its own that left them unblocked (numpy's BLAS starts one when imported) would take them there, and the command
    would never be told. (The main thread reads as unblocked while it waits: the kernel unblocks what it waits for.)"""
    done = profile(tmp_path, "--", sys.executable, script(tmp_path, PROBE, "probe.py"))
    threads = next(line for line in done.stdout.splitlines() if line.startswith("threads"))
    assert threads.endswith("[('SIGINT', 'SIGTERM')]") and not threads.startswith("threads 0"), done.stdout
    assert "command []" in done.stdout


def test_a_command_that_does_not_exist(tmp_path):
    done = profile(tmp_path, "--", "no-such-trainer", "--epochs", "3")
    assert done.returncode == 2
    assert "Could not start `no-such-trainer`" in error_paragraph(done.stderr)
    assert not (tmp_path / "runs").exists()


def test_the_child_keeps_its_arguments_folder_environment_input_and_exit_status(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    name = script(
        work,
        """
        import json, os, sys
        line = sys.stdin.readline().strip()
        print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "mine": os.environ.get("MINE"), "stdin": line}))
        sys.exit(7)
        """,
    )
    done = profile(work, "--", sys.executable, name, "--lr", "0.1", "two words", input="hello\n", env={"MINE": "yes"})
    assert done.returncode == 7
    seen = json.loads(done.stdout.splitlines()[0])
    assert seen == {"argv": [name, "--lr", "0.1", "two words"], "cwd": str(work), "mine": "yes", "stdin": "hello"}
    paragraph = error_paragraph(done.stderr)
    assert "exited with status 7 after" in paragraph and "never imported TensorFlow" in paragraph


def test_an_existing_sitecustomize_still_runs(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIR_SITE'] = 'ran'\n")
    name = script(tmp_path, "import os, sitecustomize\nprint(os.environ.get('THEIR_SITE'), sitecustomize.__file__)\n")
    done = profile(tmp_path, "--", sys.executable, name, env={"PYTHONPATH": str(theirs)}, timeout=60)
    ran, module = done.stdout.split()
    assert ran == "ran" and module == str(theirs / "sitecustomize.py")
    assert "never imported TensorFlow" in error_paragraph(done.stderr)


def test_a_log_folder_with_files_is_refused(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "old.txt").write_text("x")
    done = profile(tmp_path, "--logdir", "logs", "--", sys.executable, "-c", "pass")
    assert done.returncode == 2 and "already holds files" in error_paragraph(done.stderr)


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another user needs root (the Docker service's case)")
def test_chown_hands_what_the_run_wrote_as_root_back_to_the_user(tmp_path):
    kept = tmp_path / "before.txt"
    kept.write_text("written before the run")
    os.utime(kept, (time.time() - 3600, time.time() - 3600))
    name = script(tmp_path, "open('checkpoint.txt', 'w').write('mine')\n")
    done = profile(tmp_path, "--chown", "4242:4343", "--", sys.executable, name)
    assert done.returncode == 2  # never imported TensorFlow
    written = (tmp_path / "checkpoint.txt").stat()
    assert (written.st_uid, written.st_gid) == (4242, 4343)
    assert kept.stat().st_uid == 0


def test_no_command_is_one_paragraph(tmp_path):
    done = profile(tmp_path)
    assert done.returncode == 2 and "after --" in error_paragraph(done.stderr)


# ---- a Keras script, end to end (one TensorFlow import in the child) -------------------------------------------


@pytest.mark.slow
def test_a_keras_script_is_profiled_without_a_change_and_the_parent_never_imports_tensorflow(tmp_path):
    """The CLI in a fresh interpreter that checks, at its end, that TensorFlow was never imported there."""
    name = script(tmp_path, FIT)
    harness = (
        "import sys\nfrom step_doctor import cli\nstatus = cli.main(sys.argv[1:])\n"
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, 'the parent imported TensorFlow'\n"
        "sys.exit(status)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", harness, "profile", "--json", "--logdir", "logs", "--", sys.executable, name, "40"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)  # with --json the script's own output goes to stderr
    assert "my script's own output" in done.stderr
    run = document["runs"]["my_train"]
    assert run["profile"]["has_step_markers"] and not run["steps_inferred"] and run["verdict"] != "unknown"
    process = document["capture"]["processes"][0]
    assert process["mode"] == "keras-fit" and process["window"]["steps"] == [5, 16]
    assert process["capture"]["state"] == "done" and process["steps_seen"] == 40
    assert document["utilization"]["whole_run"]["samples"] >= 1
    assert document["tensorboard"] == "tensorboard --logdir logs"
    logs = tmp_path / "logs"
    assert len(list((logs / "my_train" / "plugins" / "profile").glob("*/*.xplane.pb"))) == 1
    assert json.loads((logs / "profile.json").read_text())["runs"].keys() == {"my_train"}

    import tensorflow as tf

    events = list((logs / "utilization").glob("events.out.tfevents.*"))
    tags = {value.tag for event in tf.compat.v1.train.summary_iterator(str(events[0])) for value in event.summary.value}
    assert "cpu_utilization_percent" in tags


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("tf_keras") is None, reason="tf_keras is not installed (NVIDIA's image has it)"
)
def test_a_tf_keras_script_gets_the_same_capture(tmp_path):
    name = script(tmp_path, FIT.replace("import keras", "import tf_keras as keras"))
    done = profile(tmp_path, "--json", "--", sys.executable, name, env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    assert document["runs"]["my_train"]["profile"]["has_step_markers"]
    assert document["capture"]["processes"][0]["mode"] == "keras-fit"


@pytest.mark.long
def test_a_script_that_starts_its_own_profiler_during_the_window_gets_its_session(tmp_path):
    own = FIT.replace(
        "model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)",
        "def batch_begin(batch, logs):\n"
        "    if batch == 9:\n"
        "        tf.profiler.experimental.start('own_profile')\n"
        "    if batch == 12:\n"
        "        tf.profiler.experimental.stop()\n"
        "\n"
        "hook = keras.callbacks.LambdaCallback(on_train_batch_begin=batch_begin)\n"
        "model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[hook])",
    )
    name = script(tmp_path, own)
    done = profile(tmp_path, "--json", "--logdir", "logs", "--", sys.executable, name)
    assert done.returncode == 0, done.stderr[-3000:]
    process = json.loads(done.stdout)["capture"]["processes"][0]
    assert process["capture"]["why"] == "the script started its own profiler session"
    assert any("started its own profiler session (step 9)" in note for note in process["notes"])
    assert list((tmp_path / "own_profile").rglob("*.xplane.pb"))  # the script's session ran and saved
    assert list((tmp_path / "logs" / "my_train").rglob("*.xplane.pb"))  # and so did profile's, before it


# ---- slow: failures of scripts that import TensorFlow ---------------------------------------------------------


@pytest.mark.long
def test_a_script_that_never_trains_says_so_and_how_long_it_ran(tmp_path):
    name = script(tmp_path, "import tensorflow as tf\nprint(float(tf.reduce_sum(tf.ones(3))))\n")
    done = profile(tmp_path, "--", sys.executable, name)
    assert done.returncode == 4 and "3.0" in done.stdout
    paragraph = error_paragraph(done.stderr)
    assert "exited with status 0 after" in paragraph and "never trained" in paragraph
    assert not (tmp_path / "runs").exists()


@pytest.mark.long
def test_a_script_that_fails_after_the_window_is_diagnosed_and_keeps_its_status(tmp_path):
    name = script(tmp_path, FIT + "\nraise SystemExit('my script failed after training')\n")
    done = profile(tmp_path, "--logdir", "logs", "--", sys.executable, name)
    assert done.returncode == 1
    assert "my_train: " in done.stdout and "TensorBoard, the profile and the utilization" in done.stdout
    paragraph = error_paragraph(done.stderr)
    assert f"`{sys.executable} {name}` exited with status 1 after" in paragraph and "diagnosed above" in paragraph


@pytest.mark.long
def test_a_script_that_ends_before_the_window_suggests_steps(tmp_path):
    unknown_length = FIT.replace("steps_per_epoch=steps", "steps_per_epoch=None").replace(
        ".repeat()",
        ".take(4).filter(lambda x, y: True)",  # Keras cannot tell the length: no window fits in advance
    )
    name = script(tmp_path, unknown_length)
    done = profile(tmp_path, "--", sys.executable, name)
    assert done.returncode == 4
    paragraph = error_paragraph(done.stderr)
    assert "Keras fit ran 4 step(s) (steps 0-3)" in paragraph and "--steps 1-3" in paragraph


@pytest.mark.long
def test_a_script_killed_by_sigterm_before_the_window(tmp_path):
    name = script(
        tmp_path,
        """
        import os, signal
        import tensorflow as tf
        os.kill(os.getpid(), signal.SIGTERM)
        """,
    )
    done = profile(tmp_path, "--", sys.executable, name)
    assert done.returncode == 128 + signal.SIGTERM
    paragraph = error_paragraph(done.stderr)
    assert "was killed by SIGTERM after" in paragraph and "never trained" in paragraph


@pytest.mark.long
def test_a_process_that_dies_inside_the_profilers_stop_is_named_not_taken_for_one_that_never_trained(tmp_path):
    """TensorFlow's stop crashes natively now and then under MultiWorkerMirroredStrategy (3 of 34 runs of two
    workers here); an abort in its place stands in for that crash, in a real profiled process."""
    crash = "import os\nimport tensorflow as tf\ntf.profiler.experimental.stop = lambda *a, **k: os.abort()\n"
    name = script(tmp_path, crash + FIT)
    done = profile(tmp_path, "--logdir", "logs", "--", sys.executable, name)
    assert done.returncode == 128 + signal.SIGABRT
    paragraph = error_paragraph(done.stderr)
    assert "was killed by SIGABRT" in paragraph and "died inside tf.profiler.experimental.stop()" in paragraph
    assert "never trained" not in paragraph and not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_ctrl_c_is_forwarded_and_what_was_captured_is_diagnosed(tmp_path):
    name = script(tmp_path, FIT)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    parent = subprocess.Popen(
        [str(STEP_DOCTOR), "profile", "--logdir", "logs", "--", sys.executable, name, "1000000"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, so that a failure here ends the training it started too
    )
    try:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "logs").glob("my_train/plugins/profile/*/*.xplane.pb")):
            assert time.monotonic() < deadline and parent.poll() is None, "no capture within 120 s"
            time.sleep(0.5)
        parent.send_signal(signal.SIGINT)  # to the parent alone, as a supervisor would: it must pass it on
        out, err = parent.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
    assert parent.returncode == 130
    assert "my_train: " in out
    assert "was stopped by Ctrl-C (SIGINT) after" in error_paragraph(err)
