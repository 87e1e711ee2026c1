"""Workloads as plugins: training, the CLI and the benchmarks never branch on a workload's name, a config loads
without TensorFlow, and a third workload is one folder and one registration: the toy one of
docs/make-it-yours.md, built from that page, trains and runs a benchmark trial."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, child_env, quiet
from train import workloads

PACKAGE = ROOT / "train"
NAMES = set(workloads.names())
SECTION_KEYS = tuple(f"{name}." for name in NAMES - {workloads.DEFAULT})  # text.pipeline...: a section by name


def _constants(node) -> list:
    if isinstance(node, ast.Constant):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [value for element in node.elts for value in _constants(element)]
    return []


def _names_a_workload(node) -> bool:
    """`cfg.task`, `cfg.workload`, `result["task"]`, `result.get("workload")`: which workload a value is."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("task", "workload")
    if isinstance(node, ast.Subscript):
        return any(value in ("task", "workload") for value in _constants(node.slice))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return any(value in ("task", "workload") for value in _constants(node.args[0] if node.args else None))
    return False


def branches_on_a_workload(path: Path) -> list[str]:
    """Where a module compares with a workload's name, keys a table by workload names, imports one workload's
    package or names one workload's section: each a branch that a new workload would have to add to."""
    found, shown = [], path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    for node in ast.walk(ast.parse(path.read_text())):
        where = f"{shown}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            named = {value for operand in operands for value in _constants(operand) if value in NAMES}
            strings = any(isinstance(value, str) for operand in operands for value in _constants(operand))
            if named or (strings and any(_names_a_workload(operand) for operand in operands)):
                found.append(f"{where}: compares with {sorted(named) or 'a workload name'}")
        elif isinstance(node, ast.Dict):
            keys = {value for key in node.keys if key is not None for value in _constants(key)}
            if len(keys & NAMES) >= 2:
                found.append(f"{where}: a table keyed by workload names {sorted(keys & NAMES)}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.module == "train.workloads":
                modules += [f"train.workloads.{alias.name}" for alias in node.names]
            for module in modules:
                if any(module.startswith(f"train.workloads.{name}") for name in NAMES):
                    found.append(f"{where}: imports {module}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(SECTION_KEYS):
            found.append(f"{where}: names a workload's section ({node.value!r})")
    return found


def test_no_module_outside_the_workload_folders_branches_on_a_workload():
    outside = [p for p in PACKAGE.rglob("*.py") if (PACKAGE / "workloads") not in p.parents]
    found = [line for path in outside for line in branches_on_a_workload(path)]
    assert not found, "\n".join(found)


def test_the_check_finds_the_branches_it_is_for(tmp_path):
    module = tmp_path / "branchy.py"
    module.write_text(
        textwrap.dedent(
            """
            from train.workloads.text import pipeline
            CPU = {"image": "a.yaml", "text": "b.yaml"}
            if cfg.task == "text" or result.get("workload", "image") != "image":
                key = "text.pipeline.token_budget"
            """
        )
    )
    assert len(branches_on_a_workload(module)) == 5, branches_on_a_workload(module)


def test_loading_any_preset_or_workload_imports_no_tensorflow():
    code = (
        "import sys\n"
        "from train import config, workloads\n"
        "for preset in ('configs/text/optimized.yaml', 'configs/text/naive.yaml', 'configs/optimized.yaml'):\n"
        "    config.load(preset)\n"
        "for name in workloads.names():\n"
        "    workloads.get(name)\n"
        "loaded = [name for name in ('tensorflow', 'keras') if name in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_every_registered_workload_has_settings_presets_and_the_interface():
    from train.workloads.base import Workload

    for name in NAMES:
        settings, workload = workloads.settings(name), workloads.get(name)
        assert isinstance(workload, Workload) and workload.name == name
        assert settings.SECTIONS and callable(settings.check)
        for preset in ("base", "naive", "optimized"):
            assert (ROOT / workload.presets.path(preset)).is_file(), (name, preset)
        assert (ROOT / workload.presets.cpu_scenario).is_file()


def toy_workload(root: Path) -> tuple[str, str]:
    """The toy workload of docs/make-it-yours.md written as a package under `root`, and its base preset."""
    section = (ROOT / "docs/make-it-yours.md").read_text().split("## A new workload")[1]
    blocks = re.findall(r"```(python|yaml)\n(.*?)```", section, re.S)
    settings = next(code for kind, code in blocks if kind == "python" and "SECTIONS" in code)
    workload = next(code for kind, code in blocks if kind == "python" and "WORKLOAD =" in code)
    preset = next(code for kind, code in blocks if kind == "yaml")
    lines = (re.fullmatch(r'\s*"(\w+)": "([\w.]+)",\s*', code) for _, code in blocks)  # REGISTERED's new line
    name, package = next(line for line in lines if line).groups()
    assert package == f"train.workloads.{name}"  # the page's folder; here a package of its own under `root`
    folder = root / "toy_signal"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "settings.py").write_text(settings)
    (folder / "workload.py").write_text(workload)
    return name, preset


@pytest.mark.slow
def test_a_third_workload_is_one_folder_and_one_registration(tmp_path, monkeypatch):
    """The toy workload of docs/make-it-yours.md: its data built, trained by the fit loop, summarized, and measured
    by a benchmark trial and its pipeline alone, through the same code as images and text."""
    from train import config
    from train.benchmarks import trials
    from train.training import devices, fit_loop

    name, preset = toy_workload(tmp_path / "code")
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    workloads.register(name, "toy_signal")
    try:
        (tmp_path / "base.yaml").write_text(preset)
        sets = [f"runs_dir={tmp_path / 'runs'}", f"signal.data.data_dir={tmp_path / 'shards'}", "profile.enabled=false"]
        sets += ["monitor.enabled=false", "checkpoint.enabled=false", "name=toy"]
        cfg = config.load(tmp_path / "base.yaml", sets)
        assert (cfg.workload, cfg.signal.pipeline.batch_size, cfg.model.params) == (name, 32, {"width": 16})
        with pytest.raises(config.UserError, match=r"'signal\.data\.classes' is 1 but must be >= 2"):
            config.load(tmp_path / "base.yaml", sets + ["signal.data.classes=1"])
        workload = workloads.get(name)
        with pytest.raises(config.UserError, match="make data TASK=signal"):
            workload.locate(cfg)
        spec, built = workload.prepare_data(cfg)
        assert built and not workload.prepare_data(cfg)[1]
        summary = fit_loop.run(cfg, log=quiet)
        assert summary["workload"] == name and summary["unit"] == "examples/s"
        assert summary["examples_per_sec"] > 0 and summary["steps_per_epoch"] == 512 // 32
        assert summary["val_accuracy"] > 0.5  # three frequencies, told apart after two epochs
        assert (cfg.run_dir / "model.keras").is_file() and "batch(32)" in summary["pipeline"]

        found = devices.detect()
        variant = trials.prepare("toy", cfg, spec, found, warmup_seconds=0.2, log=quiet)
        assert variant.trial(0.2) > 0 and variant.unit == "examples/s"
        cost = trials.pipeline_cost(cfg, spec, found, seconds=0.2)
        assert cost["core_seconds_per_example"] > 0 and cost["examples_per_sec_alone"] > 0
    finally:
        workloads.REGISTERED.pop(name, None)
        workloads._LOADED.pop(name, None)
