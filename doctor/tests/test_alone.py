"""The doctor on its own: `pip install ./doctor` into a fresh virtualenv that holds only TensorFlow, as a user's does.

Marked `install` (a fresh virtualenv with TensorFlow costs one to two minutes): `make test-doctor-alone` runs it, and
CI runs that target. Nothing of the template is importable there, and nothing of it is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.conftest import DOCTOR

CONSTRAINTS = DOCTOR.parent / "constraints.txt"  # the versions the repository tests: tensorflow-cpu among them
SCRIPT = """
import numpy as np
import tensorflow as tf
import keras

def normalize(image):  # per row, in a Python loop, as scripts often do
    image = np.asarray(image, np.float32)
    for row in image:
        row -= row.mean()
        row /= row.std() + 1e-6
    return image

def load(image, label):
    image = tf.numpy_function(normalize, [image], tf.float32)
    image.set_shape((96, 96, 3))
    return image, label

images = np.random.default_rng(0).integers(0, 255, (256, 96, 96, 3), dtype=np.uint8)
labels = np.arange(256) % 4
ds = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().map(load).batch(32)
model = keras.Sequential([keras.Input((96, 96, 3)), keras.layers.Conv2D(4, 3, strides=4), keras.layers.Flatten(),
                          keras.layers.Dense(4)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(ds, steps_per_epoch=30, epochs=1, verbose=0)
"""


# one hook per process: setuptools reads a second hook's options wrongly in the same process (84.2.1)
BUILD = "import sys; from setuptools import build_meta; getattr(build_meta, sys.argv[1])(sys.argv[2])"


def _run(command, cwd: Path, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(c) for c in command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**environ, **(env or {})},
    )
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-3000:])
    return done


@pytest.mark.install
def test_the_doctor_alone_beside_tensorflow_profiles_and_diagnoses_a_keras_script(tmp_path):
    venv, source = tmp_path / "venv", tmp_path / "doctor"
    # pip builds in the folder it installs from: a copy keeps the checkout free of build/ and *.egg-info
    shutil.copytree(DOCTOR, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    _run([sys.executable, "-m", "venv", venv], tmp_path)
    python = venv / "bin" / "python"
    # the wheel and the sdist as pip builds them: everything a user runs must be in them, the fix's source included
    dist = tmp_path / "dist"
    _run([python, "-m", "pip", "install", "-q", "-c", CONSTRAINTS, "setuptools>=68"], tmp_path)
    for hook in ("build_wheel", "build_sdist"):
        _run([python, "-c", BUILD, hook, dist], source)
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    for archive, names in ((wheel, zipfile.ZipFile(wheel).namelist()), (sdist, tarfile.open(sdist).getnames())):
        shipped = {Path(name).name for name in names if "/profile/site/" in name}
        assert {"traceme_consume_fix.cc", "traceme_consume_fix.map", "tf_binary.py"} <= shipped, (archive, shipped)
    # the wheel holds what a user runs: no developer tool (step_doctor_dev/, the fake NVML, the cost benches)
    in_wheel = zipfile.ZipFile(wheel).namelist()
    developer = [n for n in in_wheel if n.startswith("step_doctor_dev") or "/scale/" in n]
    assert not developer and not {"testing.py", "bench.py", "survival.py"} & {Path(n).name for n in in_wheel}
    _run(
        [python, "-m", "pip", "install", "-q", "-c", CONSTRAINTS, "tensorflow-cpu", "pillow", wheel],
        tmp_path,
        timeout=900,
    )

    work = tmp_path / "work"
    work.mkdir()
    (work / "my_train.py").write_text(textwrap.dedent(SCRIPT))
    found = _run([python, "-c", "import importlib.util as u; print([u.find_spec(m) for m in ('train', 'data')])"], work)
    assert found.stdout.strip() == "[None, None]", found.stdout  # nothing of the template is installed
    frozen = _run([python, "-m", "pip", "freeze"], work).stdout.lower()
    assert "gpu-utilization-template" not in frozen and "tensorflow-datasets" not in frozen

    doctor = venv / "bin" / "step-doctor"
    done = _run([doctor, "profile", "--json", "--logdir", "logs", "--", python, "my_train.py"], work)
    run = json.loads(done.stdout)["runs"]["my_train"]
    causes = [r["cause"] for r in run["recommendations"]]
    assert run["verdict"] == "input-bound" and causes[0] == "python-in-map", (run["verdict"], causes)
    assert run["profile"]["skipped"] == [], run["profile"]["skipped"]  # xprof's breakdown, by the installed child

    text = _run([venv / "bin" / "step-doctor", "diagnose", "logs"], work).stdout
    assert "INPUT-BOUND" in text and "python-in-map" in text

    # Two MultiWorkerMirroredStrategy workers, started by the script itself: each captured, with the fix for
    # TensorFlow's crash in stop() built from the installed wheel's source, checked in effect and loaded.
    for name in ("user_pipelines.py", "xla_pipelines.py"):
        shutil.copy(DOCTOR / "tests" / name, work / name)
    _run([python, "user_pipelines.py", "--make-files", "files"], work)
    cache = tmp_path / "cache"
    done = _run(
        [
            doctor,
            "profile",
            "--json",
            "--logdir",
            "mw",
            "--",
            python,
            "user_pipelines.py",
            "multi_worker_generator",
            "files",
        ],
        work,
        env={"STEP_DOCTOR_CACHE": str(cache)},
    )
    document = json.loads(done.stdout)
    assert set(document["runs"]) == {"worker-0", "worker-1"}, document.get("error")
    workers = [p for p in document["capture"]["processes"] if (p.get("run") or "").startswith("worker-")]
    assert {p["run"] for p in workers if p["capture"]["state"] == "done"} == {"worker-0", "worker-1"}
    for process in workers:
        fix = process["consume_fix"]
        assert fix["loaded"] and fix["binary"]["verdict"] == "fixable", fix
        assert Path(fix["library"]).parent == cache and Path(fix["library"]).exists()
