"""The README's quick start from the command line: `make compare`'s table and report, TensorBoard's Profile tab
(README.md), and the doctor's diagnose on what compare wrote (docs/doctor.md)."""

import gzip
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import PROFILE_EARLY, ROOT, SHORT_RUN, child_env, data_sets, run_cli, set_args

# Two profiled epochs for each of compare's runs.
PROFILED = SHORT_RUN + PROFILE_EARLY + ["pipeline.shuffle_buffer=16", "profile.num_steps=3"]


@pytest.fixture(scope="module")
def compared(tiny_data_dir, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    sets = set_args(data_sets(tiny_data_dir) + PROFILED)
    result = run_cli("compare", "--out", str(runs / "compare"), *sets, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return runs, result


@pytest.mark.slow
def test_compare_prints_the_table_and_writes_the_report(compared):
    runs, result = compared
    assert "No GPU found: running the CPU scenario that mirrors a fast GPU" in result.stdout
    assert "examples/s" in result.stdout and "speedup (optimized / naive examples/s)" in result.stdout
    report = json.loads((runs / "compare" / "report.json").read_text())
    for name in ("naive", "optimized"):
        row = report["runs"][name]
        for key in (
            "examples_per_sec",
            "step_time_ms",
            "input_bound_percent",
            "device_busy_percent",
            "gpu_utilization_percent",
            "cpu_utilization_percent",
            "val_accuracy",
        ):
            assert key in row
        assert row["examples_per_sec"] > 0 and row["input_bound_percent"] is not None
        assert row["device_busy_percent"] is None and row["gpu_utilization_percent"] is None  # CPU machine
    assert report["speedup"] == pytest.approx(
        report["runs"]["optimized"]["examples_per_sec"] / report["runs"]["naive"]["examples_per_sec"]
    )
    assert report["device"].startswith("CPU only")
    naive = json.loads((runs / "compare" / "naive" / "summary.json").read_text())
    assert "Generator" in {stage["stage"] for stage in naive["profile"]["slow_stages"]}  # the Python generator
    assert (runs / "compare" / "report.png").stat().st_size > 10_000
    assert "| examples/s |" in (runs / "compare" / "report.md").read_text()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return json.loads(body)


@pytest.mark.slow
def test_tensorboard_profile_tab_shows_both_runs_with_step_times(compared):
    runs, _ = compared
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "train", "tensorboard", "--logdir", str(runs), "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, listed = time.monotonic() + 120, []
        while time.monotonic() < deadline:
            try:
                listed = _get(f"{base}/data/plugin/profile/runs")
                if len(listed) >= 2:
                    break
            except OSError:
                pass
            time.sleep(1)
        assert "profile" in _get(f"{base}/data/plugins_listing")
        names = {run.split("/")[1] for run in listed}
        assert {"naive", "optimized"} <= names, listed
        for run in listed:
            session = next((runs / run.rsplit("/", 1)[0] / "plugins" / "profile").iterdir())
            host = next(session.glob("*.xplane.pb")).name.removesuffix(".xplane.pb")
            assert "input_pipeline_analyzer" in json.dumps(_get(f"{base}/data/plugin/profile/run_tools?run={run}"))
            tables = _get(f"{base}/data/plugin/profile/data?run={run}&tag=input_pipeline_analyzer&host={host}")
            step = next(t for t in tables if "steptime_ms_average" in t.get("p", {}))
            assert float(step["p"]["steptime_ms_average"]) > 0 and step["rows"], run
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow  # diagnose over a folder of several runs: fast in test_diagnose.py, without compare's two runs
def test_diagnose_reads_the_compare_folder(compared):
    runs, _ = compared
    command = [sys.executable, "-m", "step_doctor", "diagnose", str(runs / "compare")]  # the doctor's command
    result = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    assert "== naive ==" in result.stdout and "== optimized ==" in result.stdout
    assert result.stdout.count("verdict: ") == 2


def test_bad_config_key_is_one_paragraph_not_a_traceback():
    result = run_cli("fit", "--config", "configs/optimized.yaml", "--set", "pipeline.bach_size=64", timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    assert "Did you mean 'batch_size'" in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.slow
def test_missing_dataset_names_the_exact_command(tmp_path):
    result = run_cli("fit", "--config", "configs/naive.yaml", "--set", f"data.data_dir={tmp_path}", timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"python -m train data --config configs/naive.yaml --set data.data_dir={tmp_path}" in result.stderr


def test_data_command_is_a_no_op_when_built(tiny_data_dir):
    sets = set_args(data_sets(tiny_data_dir))
    result = run_cli("data", "--config", "configs/base.yaml", *sets, timeout=120)
    assert result.returncode == 0 and "Already built (nothing to do)" in result.stdout
