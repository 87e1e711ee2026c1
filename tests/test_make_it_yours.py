"""The README's "Make it yours" walk-through, step by step, on a copy of the repository."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, child_env, make_image_folder


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}")
    return text[start : text.index("\n## ", start + 1)]


def _fork(tmp_path: Path) -> Path:
    """A fresh copy of the repository's tracked files, as `git clone` of a fork gives."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    fork = tmp_path / "fork"
    for name in files:
        if (ROOT / name).is_file():
            (fork / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, fork / name)
    return fork


def _set_block(text: str, block: str, section: str) -> str:
    """configs/base.yaml with the keys of one of the README's yaml blocks (`data:` or `model:`) set; a `model:`
    block replaces the whole model section (another model's parameters do not apply)."""
    keys = re.findall(r"^  (\w+): (\S+)", block, re.M)
    if section == "model":
        body = "".join(f"  {key}: {value}\n" for key, value in keys)
        return re.sub(r"^model:\n(?:  .*\n)+", "model:\n" + body, text, count=1, flags=re.M)
    for key, value in keys:
        text = re.sub(rf"^  {key}: .*$", f"  {key}: {value}", text, count=1, flags=re.M)
    return text


def follow_make_it_yours(fork: Path, images: Path) -> str:
    """Steps 2-3 of the README's walk-through in `fork`: its data block, the transforms it says to keep for photos,
    and its model, registered in train/models.py and named in configs/base.yaml. Returns the section."""
    section = readme_section("Make it yours")
    blocks = re.findall(r"```(yaml|python)\n(.*?)```", section, re.S)
    data = next(textwrap.dedent(b) for kind, b in blocks if kind == "yaml" and b.lstrip().startswith("data:"))
    model = next(textwrap.dedent(b) for kind, b in blocks if kind == "yaml" and b.lstrip().startswith("model:"))
    code = next(textwrap.dedent(b) for kind, b in blocks if kind == "python" and "@register_model" in b)
    base = _set_block((fork / "configs/base.yaml").read_text(), data.replace("/data/my_images", str(images)), "data")
    assert "flip_up_down" in section  # the walk-through says to drop the up-down flip for photos
    base = re.sub(r"^(  transforms: \[.*)flip_up_down, ?(.*)$", r"\1\2", base, count=1, flags=re.M)
    base = _set_block(base, model, "model")
    (fork / "configs/base.yaml").write_text(base)
    models = fork / "train/models.py"
    models.write_text(models.read_text() + "\n\n" + code)
    transforms = re.search(r"^  transforms: (.*)$", base, re.M).group(1)
    assert f"source: imagefolder:{images}" in base and "flip_up_down" not in transforms
    assert re.search(r"^  name: (\w+)", model, re.M).group(1) in code
    return section


# make test: the walk-through to `make data` and the fast tests that train there; make test-long: `make compare`
# in the fork too, then every fast test.
@pytest.mark.long
@pytest.mark.parametrize("compare", [False, True], ids=["data", "compare"])
def test_make_it_yours_walkthrough_trains_and_reports_and_the_fast_tests_still_pass(tmp_path, compare):
    fork = _fork(tmp_path)
    # Step 2: a folder of images per class (about 300 training images).
    images = make_image_folder(tmp_path / "my_images", per_class=110)
    section = follow_make_it_yours(fork, images)
    # Steps 4 and 5, the commands as the README gives them (using this checkout's installed .venv).
    # A fresh shell's make: not the variables (ARGS=...) of a `make test` this test may run under.
    env = {
        k: v
        for k, v in child_env(fork).items()
        if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "ARGS")
    }
    make = ["make", "--no-print-directory", f"VENV={Path(sys.executable).parent.parent}", "STAMP="]
    targets = list(dict.fromkeys(re.findall(r"`make (data|compare)`", section)))
    assert targets == ["data", "compare"]
    for target in targets[: len(targets) if compare else 1]:
        result = subprocess.run(make + [target], cwd=fork, env=env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, target + result.stdout[-3000:] + result.stderr[-3000:]
        if target == "data":
            assert "Built: imagefolder_my_images" in result.stdout and "3 classes" in result.stdout
    if compare:
        report = json.loads((fork / "runs/compare/report.json").read_text())
        assert report["dataset"]["num_classes"] == 3
        assert report["runs"]["optimized"]["val_accuracy"] is not None
        assert (fork / "runs/compare/report.md").exists() and (fork / "runs/compare/report.png").exists()
    # Without a GPU, compare swaps in the CPU scenario's tiny model; the presets themselves name the forker's.
    named = "from train import config; c = config.load('configs/optimized.yaml'); print(c.model.name, c.model.params)"
    loaded = subprocess.run([sys.executable, "-c", named], cwd=fork, env=env, capture_output=True, text=True)
    assert loaded.stdout.startswith("my_cnn {"), loaded.stdout + loaded.stderr[-2000:]
    # The fast tests that build the tiny dataset and train, in the fork: they train on the built-in data and the
    # tiny model, whatever configs/base.yaml now says (every fast test under make test-long).
    _fast_tests_pass(fork, env, ["tests"] if compare else FIXTURE_TESTS)


# The modules whose fixtures build the tiny dataset from the configs and train on it: what a fork's edits to
# configs/base.yaml and train/models.py could break.
FIXTURE_TESTS = ["tests/test_fit.py", "tests/test_pipeline.py", "tests/test_config.py"]


def _fast_tests_pass(fork: Path, env: dict, paths: list[str]) -> None:
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow and not long", *paths],
        cwd=fork,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert tests.returncode == 0, tests.stdout[-4000:]
