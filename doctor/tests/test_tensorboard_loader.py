"""The Diagnose tab's entry point: registered for TensorBoard, and harmless when it cannot load.

TensorBoard imports every `tensorboard_plugins` entry point unguarded, so a tab whose imports fail
must not take the Profile tab (or TensorBoard) down with it. These build TensorBoard's app with its
default plugins, as `tensorboard --logdir` does; xprof's loader imports TensorFlow, so the first
costs its import (5-7 s here).
"""

from __future__ import annotations

import ast
import json
import sys
from importlib.metadata import entry_points
from pathlib import Path

from tensorboard import default, program
from tensorboard.backend import application
from werkzeug.test import Client

from step_doctor.tensorboard import loader
from step_doctor.tensorboard.loader import DiagnoseLoader
from tests import tab_logs


def _listing(logdir) -> dict:
    board = program.TensorBoard(plugins=default.get_plugins())
    board.configure(argv=[None, "--logdir", str(logdir)])
    app = application.TensorBoardWSGIApp(board.flags, board.plugin_loaders, None, board.assets_zip_provider, None)
    response = Client(app).get("/data/plugins_listing")
    assert response.status_code == 200
    return json.loads(response.get_data())


def test_the_tab_is_registered_as_a_tensorboard_plugin():
    (entry,) = [e for e in entry_points(group="tensorboard_plugins") if e.name == "diagnose"]
    assert entry.load() is DiagnoseLoader


def test_default_tensorboard_shows_the_tab_next_to_profile(tmp_path):
    tab_logs.profile(tmp_path / "run")
    listing = _listing(tmp_path)
    assert listing["profile"]["enabled"] and listing["diagnose"]["enabled"]
    assert listing["diagnose"]["tab_name"] == "Diagnose"


def test_a_tab_whose_imports_fail_leaves_tensorboard_and_profile_working(tmp_path, monkeypatch, caplog):
    tab_logs.profile(tmp_path / "run")
    monkeypatch.delitem(sys.modules, "step_doctor.tensorboard.plugin", raising=False)
    monkeypatch.setitem(sys.modules, "step_doctor.tensorboard.plugin", None)  # `import` of it raises ImportError
    assert DiagnoseLoader().load(None) is None
    assert "the Diagnose tab is not available" in caplog.text
    listing = _listing(tmp_path)
    assert "diagnose" not in listing and listing["profile"]["enabled"]


def test_the_loader_module_imports_only_base_plugin_at_module_level():
    tree = ast.parse(Path(loader.__file__).read_text())
    imported = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            imported |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
    assert imported == {"__future__.annotations", "logging", "tensorboard.plugins.base_plugin"}
