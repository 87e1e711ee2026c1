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


@pytest.mark.slow
def test_make_it_yours_walkthrough_trains_and_reports(tmp_path):
    section = readme_section("Make it yours")
    # Step 1: a fresh copy of the repository (what `git clone` of a fork gives).
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    fork = tmp_path / "fork"
    for name in files:
        if (ROOT / name).is_file():
            (fork / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, fork / name)
    # Step 2: a folder of images per class (about 300 training images).
    images = make_image_folder(tmp_path / "my_images", per_class=110)
    # Step 3: the data block the README shows, with this folder's path.
    block = textwrap.dedent(re.search(r"```yaml\n((?: +.*\n)+?) *```", section).group(1))
    assert block.startswith("data:\n")
    base = (fork / "configs/base.yaml").read_text()
    for key, value in re.findall(r"^  (\w+): (\S+)", block, re.M):
        value = value.replace("/data/my_images", str(images))
        base = re.sub(rf"^  {key}: .*$", f"  {key}: {value}", base, count=1, flags=re.M)
    (fork / "configs/base.yaml").write_text(base)
    assert f"source: imagefolder:{images}" in base
    # Steps 4 and 5, the commands as the README gives them (using this checkout's installed .venv).
    env = child_env(fork)
    make = ["make", "--no-print-directory", f"VENV={Path(sys.executable).parent.parent}", "STAMP="]
    targets = list(dict.fromkeys(re.findall(r"`make (data|compare)`", section)))
    assert targets == ["data", "compare"]
    for target in targets:
        result = subprocess.run(make + [target], cwd=fork, env=env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, target + result.stdout[-3000:] + result.stderr[-3000:]
        if target == "data":
            assert "Built: imagefolder_my_images" in result.stdout and "3 classes" in result.stdout
    report = json.loads((fork / "runs/compare/report.json").read_text())
    assert report["dataset"]["num_classes"] == 3
    assert report["runs"]["optimized"]["val_accuracy"] is not None
    assert (fork / "runs/compare/report.md").exists() and (fork / "runs/compare/report.png").exists()
