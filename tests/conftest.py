"""What the tests share: a tiny synthetic dataset built once per session, the overrides of a short
run on it, and the ways a test starts one (in this process, or as a user would, in a fresh one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from step_doctor_dev import fake_nvml as testing

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
# The built-in dataset, tiny, whatever configs/base.yaml says (a fork points it at its own images): every test
# trains on it. Its shapes are still shapes upside down, so it keeps the up-down flip.
TINY_DATA = {
    "data.source": "synthetic",
    "data.image_size": 32,
    "data.num_train": 128,
    "data.num_val": 32,
    "data.num_shards": 4,
    "pipeline.transforms": "[flip_left_right, flip_up_down, shift]",
}

# --set overrides for short runs on the tiny dataset, composed by each test module for what it checks.
SHORT_RUN = ["train.epochs=2", "pipeline.batch_size=16", "monitor.interval_s=0.05"]  # 2 epochs of 8 steps
PROFILE_EARLY = ["profile.start_step=1", "profile.num_steps=2"]  # a profile window a short run reaches
NO_PROFILE = ["profile.enabled=false"]
TINY_MODEL = ["model.name=tiny", "model.width=4"]  # the cheapest registered model, whatever base.yaml names


def data_sets(data_dir: Path) -> list[str]:
    return [f"data.data_dir={data_dir}"] + [f"{k}={v}" for k, v in TINY_DATA.items()]


def set_args(items: Iterable[str]) -> list[str]:
    """Overrides as command-line arguments: `--set` before each."""
    return [arg for item in items for arg in ("--set", item)]


def quiet(message: str) -> None:
    """The `log` of runs whose progress lines no test reads."""


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


def build_pipeline(spec, knobs, *, training: bool, batch_size: int, files=None, **options):
    """`pipeline.build` of `knobs` (the validation split unless `training`), with the `auto`s that a run's plan
    decides decided for `spec` as on a machine without a GPU."""
    from train.workloads.image import pipeline
    from train.workloads.image.choices import pipeline_choices

    decided, _ = pipeline_choices(knobs, spec, gpu=False)
    if files is None:
        files = spec.train_files if training else spec.val_files
    return pipeline.build(files, spec, decided, training=training, batch_size=batch_size, **options)


COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}


def make_image_folder(root: Path, per_class: int = 16) -> Path:
    """Photos-like files of mixed sizes and formats, the class given by the dominant colour (and one file that
    is not an image): an image folder as a forker brings it."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, colour in COLOURS.items():
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            height, width = int(rng.integers(40, 90)), int(rng.integers(40, 90))
            pixels = np.clip(np.array(colour) + rng.normal(0, 25, (height, width, 3)), 0, 255).astype(np.uint8)
            suffix = ".png" if index % 3 == 0 else ".jpg"
            Image.fromarray(pixels).save(root / name / f"{name}_{index}{suffix}")
    (root / "red" / "broken.jpg").write_bytes(b"not an image at all")
    return root


def child_env(root: Path = ROOT) -> dict:
    """The environment of a fresh `python -m train` process that imports the package under `root`."""
    return {**os.environ, "PYTHONPATH": str(root)}


def train_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "train", *args]


def fit_command(sets: Iterable[str], *, preset: str = "optimized", name: str | None = None) -> list[str]:
    """`python -m train fit --config configs/<preset>.yaml [--name NAME] --set ...`, as a user types it."""
    return train_command(
        "fit", "--config", f"configs/{preset}.yaml", *(["--name", name] if name else []), *set_args(sets)
    )


def run_cli(*args: str, timeout: float = 300, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`python -m train ...` in a fresh process, as a user would run it."""
    return subprocess.run(
        train_command(*args), cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout
    )


def run_to_end(command: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `command` in a fresh process and check that it succeeded."""
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=child_env())
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def stop_after_first_epoch(command: list[str], run_dir: Path, signum: int = signal.SIGTERM) -> tuple[int, str, float]:
    """Start training, send `signum` once the first checkpoint exists: (exit status, stderr, seconds to exit)."""
    from train.training import checkpoint

    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None and not checkpoint.latest(run_dir):
            time.sleep(0.02)
        assert process.poll() is None, "training finished before it could be stopped"
        sent = time.monotonic()
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
        return process.returncode, stderr, time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def pytest_collection_modifyitems(config, items):
    testing.skip_gpu_tests_without_a_driver(items)
