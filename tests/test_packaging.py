"""The packages as a forker and an installer meet them (the template, train/ with data/, and the doctor,
doctor/step_doctor/): regular packages without import cycles, every imported distribution declared in each
one's own pyproject.toml, and the console scripts working outside the repository."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from step_doctor.callbacks import StepTraceProfiler
from tests.conftest import ROOT, data_sets, set_args

PACKAGE = ROOT / "train"
DOCTOR = ROOT / "doctor"
# package folder, the pyproject.toml that declares its distributions, its own top-level names, its other folders
PACKAGES = {
    "template": (PACKAGE, ROOT, {"train", "data"}, [ROOT / "data"]),
    "doctor": (DOCTOR / "step_doctor", DOCTOR, {"step_doctor"}, []),
}


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, imported name) for every import in the file, lazy ones included (not those for annotations
    only, under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.module, alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize("which", PACKAGES)
def test_every_folder_of_the_package_is_a_regular_package(which):
    package = PACKAGES[which][0]
    folders = {path.parent for path in package.rglob("*.py") if "__pycache__" not in path.parts}
    assert all((folder / "__init__.py").is_file() for folder in folders), folders


@pytest.mark.parametrize("which", PACKAGES)
def test_no_module_imports_one_that_imports_it_back(which):
    package = PACKAGES[which][0]
    modules = {_module_name(path, package): path for path in package.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for module, imported in _imports(path):
            if module.startswith(package.name):
                full = f"{module}.{imported}" if imported else module
                targets.add(full if full in modules else module)
        graph[name] = targets - {name}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo += graph.get(node, ())
        return False

    cycles = [(a, b) for a, targets in graph.items() for b in targets if reaches(b, a)]
    assert not cycles, cycles


@pytest.mark.parametrize("which", PACKAGES)
def test_every_imported_distribution_is_declared(which):
    package, project, own, others = PACKAGES[which]
    own = set(own)
    declared = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    names = declared["dependencies"] + [dep for extra in declared["optional-dependencies"].values() for dep in extra]
    wanted = {
        dep.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for dep in names
    }
    wanted = {name.replace("_", "-") for name in wanted}
    if which == "template":
        wanted |= {"tensorflow"}  # from an extra; the doctor's only TensorFlow imports are its Keras callbacks'
    else:
        own |= {"tensorflow", "keras"}  # callbacks.py: the script's own TensorFlow, never a dependency
    providers = importlib.metadata.packages_distributions()
    stdlib = set(sys.stdlib_module_names)
    missing = {}
    for path in [p for folder in (package, *others) for p in folder.rglob("*.py")]:
        for module, _ in _imports(path):
            top = module.split(".")[0]
            if top in stdlib or top in own or top == "__future__":
                continue
            dists = {d.lower().replace("_", "-") for d in providers.get(top, [])}
            dists = {"tensorflow" if d.startswith("tensorflow-cpu") else d for d in dists}
            if not dists & wanted:
                missing.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    assert not missing, f"imported but not declared in {project / 'pyproject.toml'}: {missing}"


def _console_script() -> Path:
    script = Path(sys.executable).parent / "gpu-template"
    assert script.is_file(), "make setup installs the console script gpu-template into the venv"
    return script


def test_the_console_script_runs_outside_the_repository(tmp_path, tiny_data_dir):
    script = _console_script()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run([script, "--help"], cwd=elsewhere, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "usage: gpu-template" in run.stdout

    # Configs and the built-in dataset's package are found in the project from any folder.
    sets = set_args(data_sets(tiny_data_dir))
    run = subprocess.run(
        [script, "data", "--config", "configs/base.yaml", *sets],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Already built" in run.stdout

    logdir = tmp_path / "logs"
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensors((np.zeros((4, 8), np.float32), np.zeros((4, 2), np.float32))).repeat()
    model.fit(
        data, steps_per_epoch=10, epochs=1, verbose=0, callbacks=[StepTraceProfiler(logdir, start_step=1, num_steps=5)]
    )
    doctor = Path(sys.executable).parent / "step-doctor"
    run = subprocess.run([doctor, "diagnose", str(logdir)], cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "verdict" in run.stdout.lower()


@pytest.mark.parametrize("which", PACKAGES)
def test_no_module_over_500_lines_and_no_function_over_80(which):
    """Small modules named for what they do: a forker reads the template, a user the doctor."""
    package = PACKAGES[which][0]
    long_files, long_functions = [], []
    for path in package.rglob("*.py"):
        text = path.read_text()
        if text.count("\n") > 500:
            long_files.append((str(path.relative_to(ROOT)), text.count("\n")))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long_functions.append((str(path.relative_to(ROOT)), node.name, node.end_lineno - node.lineno + 1))
    assert not long_files and not long_functions, (long_files, long_functions)
