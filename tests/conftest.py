"""Shared fixtures: a tiny synthetic dataset built once per session, and configs that use it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
TINY_DATA = {"data.image_size": 32, "data.num_train": 128, "data.num_val": 32, "data.num_shards": 4}


def data_sets(data_dir: Path) -> list[str]:
    return [f"data.data_dir={data_dir}"] + [f"{k}={v}" for k, v in TINY_DATA.items()]


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    """A 4-shard synthetic dataset of 128 + 32 images of 32x32, built with the real TFDS builder."""
    from train import config, sources

    data_dir = tmp_path_factory.mktemp("data")
    cfg = config.load(ROOT / "configs/base.yaml", data_sets(data_dir))
    sources.prepare(cfg.data)
    return data_dir


@pytest.fixture
def tiny_sets(tiny_data_dir, tmp_path) -> list[str]:
    """--set overrides that point a preset at the tiny dataset and a temporary runs folder."""
    return data_sets(tiny_data_dir) + [f"runs_dir={tmp_path / 'runs'}"]


@pytest.fixture
def tiny_spec(tiny_data_dir):
    from train import config, sources

    return sources.locate(config.load(ROOT / "configs/base.yaml", data_sets(tiny_data_dir)).data)


def run_cli(*args: str, timeout: float = 300, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`python -m train ...` in a fresh process, as a user would run it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests where no NVIDIA driver answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return
    except Exception:  # no library or no driver: exactly the case to skip
        pass
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with a working driver (NVML)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
