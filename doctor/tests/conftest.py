"""What the doctor's tests share: the command line as a user runs it, in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from step_doctor_dev import fake_nvml as testing

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DOCTOR = Path(__file__).resolve().parents[1]  # the doctor's folder: its package, tests and pyproject
STEP_DOCTOR = Path(sys.executable).parent / "step-doctor"  # the console script pip installed


def run_cli(*args: str, timeout: float = 300, cwd: Path = DOCTOR) -> subprocess.CompletedProcess:
    """`python -m step_doctor ...` in a fresh process, as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "step_doctor", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def pytest_collection_modifyitems(config, items):
    testing.skip_gpu_tests_without_a_driver(items)
