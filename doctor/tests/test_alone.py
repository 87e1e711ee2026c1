"""The doctor on its own: `pip install ./doctor` into a fresh virtualenv that holds only TensorFlow, as a user's does.

Marked `install` (a fresh virtualenv with TensorFlow costs one to two minutes): `make test-doctor-alone` runs it, and
CI runs that target. Nothing of the template is importable there, and nothing of it is needed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
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


def _run(command, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-3000:])
    return done


@pytest.mark.install
def test_the_doctor_alone_beside_tensorflow_profiles_and_diagnoses_a_keras_script(tmp_path):
    venv, source = tmp_path / "venv", tmp_path / "doctor"
    # pip builds in the folder it installs from: a copy keeps the checkout free of build/ and *.egg-info
    shutil.copytree(DOCTOR, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    _run([sys.executable, "-m", "venv", venv], tmp_path)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", "-c", CONSTRAINTS, "tensorflow-cpu", source], tmp_path, timeout=900)

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
