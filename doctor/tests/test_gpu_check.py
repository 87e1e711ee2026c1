"""The prepared GPU check (tools/gpu_check.py) end to end in its CPU mode: both runs profiled and diagnosed, the
table written, and what a machine without a GPU cannot measure said, never invented."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import DOCTOR

pytest.importorskip("jax", reason="JAX is not installed (make setup installs jax[cpu])")


@pytest.mark.long
def test_the_gpu_check_runs_its_cpu_part_and_says_what_it_skipped(tmp_path):
    done = subprocess.run(
        [sys.executable, str(DOCTOR / "tools" / "gpu_check.py"), "--out", str(tmp_path), "--seconds", "3"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [row["mode"] for row in result["runs"]] == ["starved", "fed"]
    for row in result["runs"]:
        assert row["exit_status"] == 0 and row["verdict"] in ("input-bound", "host-bound", "device-bound"), row
        assert row["steps_timed"] > 0 and row["cpu_utilization_percent"] is not None
        if not result["device"].startswith(tuple("0123456789")):  # no GPU: nothing of one is reported
            assert row["device_busy_percent"] is None and row["nvml_utilization_percent"] is None
    starved, fed = result["runs"]
    assert starved["first_cause"] == "python-input" and starved["input_percent"] > fed["input_percent"]
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| starved |" in table and "| fed |" in table
    if result["device"].startswith("CPU"):
        assert "Skipped here: the GPU runs" in table
