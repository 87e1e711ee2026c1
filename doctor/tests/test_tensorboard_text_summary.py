"""The verdict as a text summary, for TensorBoard's stock Text tab: what it holds, where it goes, that a
second call replaces the first, that a folder it cannot write costs a warning only, and that
`step-doctor profile` writes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.compat.proto import event_pb2

from step_doctor import diagnose as analyser
from step_doctor.diagnose.diagnosis import Diagnosis, UnreadableRun
from step_doctor.tensorboard import text_summary
from step_doctor.tensorboard.utilization import _records
from tests import tab_logs
from tests.conftest import STEP_DOCTOR


def _texts(folder: Path) -> dict[str, str]:
    """{tag: text} of the text summaries in folder's step-doctor event file, read back with TensorBoard's reader."""
    (path,) = folder.glob(f"events.out.tfevents.*{text_summary.SUFFIX}")
    found = {}
    for record in _records(path, budget=10_000_000):
        for value in event_pb2.Event.FromString(record).summary.value:
            assert value.metadata.plugin_data.plugin_name == "text"  # what the Text tab shows
            found[value.tag] = value.tensor.string_val[0].decode()
    return found


def test_each_run_gets_its_verdict_and_ranked_fixes_as_markdown(tmp_path):
    for run in ("a", "b/train"):
        tab_logs.profile(tmp_path / run)
    document = analyser.diagnose(tmp_path)
    written = text_summary.write_diagnosis(tmp_path, document)
    assert sorted(p.parent.name for p in written) == ["a", "train"]
    text = _texts(tmp_path / "b" / "train")[text_summary.DIAGNOSIS_TAG]
    assert text.startswith("**b/train: INPUT-BOUND, ")
    assert "| # | recommendation | removes per step | estimated gain |" in text
    assert "| 1 | Python inside a map (tf.py_function / tf.numpy_function) |" in text
    assert "**First fix:** Rewrite the function with TensorFlow ops" in text

    text_summary.write_diagnosis(tmp_path, document)  # again: replaces, never piles up
    assert len(list((tmp_path / "a").glob(f"*{text_summary.SUFFIX}"))) == 1


def test_compare_writes_the_table_and_both_verdicts(tmp_path):
    for run in ("naive", "optimized"):
        tab_logs.profile(tmp_path / run)
    tab_logs.report(tmp_path)
    report = json.loads((tmp_path / "report.json").read_text())
    text_summary.write_comparison(tmp_path, report)
    table = _texts(tmp_path)[text_summary.COMPARISON_TAG]
    assert "| | naive | optimized |" in table and "| examples/s | 1,493 | 3,705 |" in table
    assert "| verdict | INPUT-BOUND | INPUT-BOUND |" in table and "**Speedup: 2.48x**" in table
    assert _texts(tmp_path / "naive")[text_summary.DIAGNOSIS_TAG].startswith("**naive: INPUT-BOUND")


def test_compare_without_profiles_still_writes_the_table(tmp_path):
    tab_logs.report(tmp_path)
    report = json.loads((tmp_path / "report.json").read_text())
    text_summary.write_comparison(tmp_path, report)
    assert "| verdict | N/A | N/A |" in _texts(tmp_path)[text_summary.COMPARISON_TAG]


def test_a_folder_that_cannot_be_written_costs_a_warning_not_the_command(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    document = Diagnosis(str(blocker), {"run": UnreadableRun("damaged")})
    assert text_summary.write_diagnosis(blocker, document) == []
    assert "warning: could not write the verdict for TensorBoard's Text tab" in capsys.readouterr().err


FIT = """
import numpy as np, tensorflow as tf, keras
x = np.random.default_rng(0).random((512, 8), dtype=np.float32)
ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(16).repeat()
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(ds, steps_per_epoch=40, epochs=1, verbose=0)
"""


@pytest.mark.long
def test_step_doctor_profile_writes_the_verdict_for_the_text_tab(tmp_path):
    (tmp_path / "my_train.py").write_text(FIT)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(STEP_DOCTOR), "profile", "--logdir", "logs", "--", sys.executable, "my_train.py"],
        cwd=tmp_path,
        env={**clean, "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = _texts(tmp_path / "logs" / "my_train")[text_summary.DIAGNOSIS_TAG]
    assert text.startswith("**my_train: ") and "waits for input" in text
