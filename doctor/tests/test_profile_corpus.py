"""The corpus of users' scripts (tests/user_pipelines.py) through `step-doctor profile`, unmodified.

Each case runs as a script (`python tests/user_pipelines.py CASE FILES`) that imports nothing of this
project and holds no step-marker or profiler code; the CLI runs from a folder outside the repository,
as a user would. The first recommendation must name the planted cause, as in the in-process corpus
test (tests/test_diagnose_corpus.py), and the fine pipeline must not be input-bound. Each case pays a
TensorFlow import in its child, so the corpus is slow (about 15 s a case here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import user_pipelines
from tests.conftest import DOCTOR, STEP_DOCTOR
from tests.test_diagnose_corpus import INPUT_CAUSES, PLANTED, _check_first_cause

LOOP_PLANTED = {  # the custom-loop scripts and the user's own TensorBoard callback
    "tape_loop_sequential_map": "sequential-map",
    "mirrored_loop_generator": "python-generator",
    "own_tensorboard_numpy_function": "python-in-map",
}
ALL_PLANTED = {**PLANTED, **LOOP_PLANTED}
# `make test` runs a Keras fit script and the two custom loops through the CLI (the in-process corpus covers every
# planted cause in the fast tests, and the own-TensorBoard case has its own test below); `make test-long`, all.
MAKE_TEST = set()  # make test profiles unmodified scripts in test_profile.py and the two-worker case below


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory) -> Path:
    return user_pipelines.save_files(tmp_path_factory.mktemp("corpus-files"), match=())


def profile_script(case: str, files: Path, where: Path, *args: str, timeout: float = 600) -> dict:
    """`step-doctor profile --json -- python tests/user_pipelines.py CASE FILES` from `where`: its document."""
    user_pipelines.save_matched(files, case)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [sys.executable, str(DOCTOR / "tests" / "user_pipelines.py"), case, str(files)]
    done = subprocess.run(
        [str(STEP_DOCTOR), "profile", "--json", "--logdir", "logs", *args, "--", *command],
        cwd=where,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:  # said in full and short: CI shows the last lines of a run, and a repr loses its middle
        said = [line[:300] for line in done.stderr.splitlines() if not line.startswith(("I0000", "W0000"))]
        errors = list(dict.fromkeys(line for line in said if "Error" in line or "error:" in line))[:8]
        pytest.fail(
            f"profile of {case} exited {done.returncode}. Its stderr's errors:\n"
            + "\n".join(errors)
            + "\nIts last lines:\n"
            + "\n".join(said[-12:]),
            pytrace=False,
        )
    return json.loads(done.stdout)


def only_run(document: dict) -> dict:
    assert len(document["runs"]) == 1, document["runs"].keys()
    return next(iter(document["runs"].values()))


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=[] if case in MAKE_TEST else [pytest.mark.long]) for case in ALL_PLANTED]
)
def test_profile_names_the_planted_cause_first(corpus_files, tmp_path, monkeypatch, case):
    document = profile_script(case, corpus_files, tmp_path)
    item = only_run(document)
    monkeypatch.setitem(PLANTED, case, ALL_PLANTED[case])
    _check_first_cause(item, case)
    process = next(p for p in document["capture"]["processes"] if p.get("capture"))
    assert process["mode"] == ("custom-loop" if case in LOOP_PLANTED and "loop" in case else "keras-fit")
    if process["mode"] == "keras-fit":
        assert item["profile"]["has_step_markers"]  # profile's markers, in a script that has none
    else:
        assert item["steps_inferred"] and item["profile"]["step_source"] == "executions of the train function"


@pytest.mark.long
def test_profile_keeps_one_session_when_the_script_has_its_own_tensorboard_profiler(corpus_files, tmp_path):
    document = profile_script("own_tensorboard_numpy_function", corpus_files, tmp_path)
    notes = [note for p in document["capture"]["processes"] for note in p["notes"]]
    assert any("TensorBoard(profile_batch=(3, 14))" in note and "kept one session" in note for note in notes)
    assert document["capture"]["processes"][0]["window"]["steps"][0] == 2  # the callback's batch 3, from 0
    theirs = tmp_path / "tb_logs"
    assert theirs.exists() and not list(theirs.rglob("*.xplane.pb"))  # its other logs, no second profile
    assert list((tmp_path / "logs" / "user_pipelines").rglob("*.xplane.pb"))


@pytest.mark.long
def test_profile_of_the_fine_pipeline_is_not_input_bound(corpus_files, tmp_path):
    item = only_run(profile_script("already_fine", corpus_files, tmp_path))
    assert item["verdict"] != "input-bound" and item["profile"]["input_bound_percent"] < 5
    assert not INPUT_CAUSES & {r["cause"] for r in item["recommendations"]}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_multi_worker_processes_get_one_verdict_each(corpus_files, tmp_path):
    """The script starts two MultiWorkerMirroredStrategy workers itself (TF_CONFIG), as a launcher would: each
    captures the same twelve steps, with the fix for TensorFlow's crash in stop() loaded (site/consume_fix.py;
    without it 8 of 35 such runs lost a worker on TensorFlow 2.21), and gets a verdict of its own."""
    document = profile_script("multi_worker_generator", corpus_files, tmp_path, timeout=500)
    assert set(document["runs"]) == {"worker-0", "worker-1"}
    for item in document["runs"].values():
        assert item["verdict"] not in ("unknown", "unreadable")
        # whether the generator keeps up with the two workers' steps is the machine's: starved, it is named
        assert item["verdict"] != "input-bound" or item["recommendations"]
    workers = [p for p in document["capture"]["processes"] if (p.get("run") or "").startswith("worker-")]
    assert {p["run"] for p in workers if (p.get("capture") or {}).get("state") == "done"} == {"worker-0", "worker-1"}
    # in effect: loaded where the binary check passed, or not needed where TensorFlow carries the upstream fix (2.17)
    assert all(
        (p["consume_fix"]["loaded"] and p["consume_fix"]["binary"]["verdict"] == "fixable")
        or (p["consume_fix"]["safe"] and p["consume_fix"]["binary"]["verdict"] == "fixed-upstream")
        for p in workers
    ), [p["consume_fix"] for p in workers]
    windows = {p["run"]: (p["window"]["from_call"], p["capture"]["last_step"]) for p in workers}
    assert windows["worker-0"] == windows["worker-1"], windows  # the same steps, whatever each worker's clock said
