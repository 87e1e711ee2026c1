"""The Diagnose tab's backend through TensorBoard's own WSGI app: its routes, what it lists, its cache and
background analysis, a read-only log folder, and names that try to leave the log folder."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import threading
import time
from pathlib import Path

import pytest

from step_doctor.tensorboard import analyses, discovery, plugin, scratch_diagnosis
from tests import tab_logs
from tests.tab_logs import ROUTE, app, diagnosed, get_json


@pytest.fixture
def logs(tmp_path) -> Path:
    return tab_logs.logdir(tmp_path / "logs")


def test_lists_every_profiled_run_one_card_per_worker_and_the_compare_folder(logs):
    _, client = app(logs)
    status, body = get_json(client, "/runs")
    assert status == 200
    runs = {run["name"]: run for run in body["runs"]}
    assert set(runs) == {"compare/naive", "compare/optimized", "mw", "mw/workers/worker-1", "solo"}
    assert (runs["mw"]["group"], runs["mw"]["role"]) == ("mw", "chief")
    assert (runs["mw/workers/worker-1"]["group"], runs["mw/workers/worker-1"]["role"]) == ("mw", "worker-1")
    assert runs["solo"]["role"] == "" and runs["solo"]["hosts"] == ["host"]
    assert runs["compare/naive"]["profile_run"] == f"compare/naive/{tab_logs.SESSION}"  # the Profile tab's name
    assert body["compares"] == [{"name": "compare", "image": True}]


def test_the_frontend_is_served_and_every_module_it_imports_has_a_route(logs):
    tab, client = app(logs)
    assert tab.frontend_metadata().es_module_path == "/index.js"
    assert tab.frontend_metadata().tab_name == "Diagnose"
    entry = client.get("/data/plugin_entry.html", query_string={"name": "diagnose"})
    assert entry.status_code == 200 and b"./index.js" in entry.get_data()
    served, pending = set(), ["index.js"]
    while pending:
        name = pending.pop()
        response = client.get(f"{ROUTE}/{name}")
        assert response.status_code == 200, name
        assert response.headers["Content-Type"].startswith("text/javascript")
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        served.add(name)
        imports = re.findall(r'from "\./([\w.]+)"', response.get_data(as_text=True))
        pending += [module for module in imports if module not in served]
    assert {"index.js", "api.js", "cards.js", "chart.js", "compare.js", "dom.js"} <= served
    assert client.get(f"{ROUTE}/diagnose.css").headers["Content-Type"].startswith("text/css")


def test_a_run_is_diagnosed_in_the_background_once_per_profile(logs):
    calls = []

    def counted(run, root):
        calls.append(run.name)
        return scratch_diagnosis.analyse(run, root)

    tab, client = app(logs)
    tab._analyses._analyse = counted
    found = diagnosed(client, "compare/naive")
    assert found["state"] == "done", found
    item = found["diagnosis"]
    assert item["verdict"] == "input-bound" and not item["steps_inferred"]
    assert item["recommendations"][0]["cause"] == "python-in-map"
    assert {"title", "evidence", "fix", "caveat", "removes_ms", "estimated_gain"} <= set(item["recommendations"][0])
    assert "waits for input" in found["headline"] and not found["headline"].startswith("INPUT-BOUND")
    assert found["text"].startswith("compare/naive: INPUT-BOUND")
    assert item["profile"]["session"] == str((logs / "compare/naive/plugins/profile" / tab_logs.SESSION).resolve())
    assert diagnosed(client, "compare/naive")["diagnosis"] == item and calls == ["compare/naive"]  # cached

    xplane = logs / "compare/naive/plugins/profile" / tab_logs.SESSION / "host.xplane.pb"
    later = time.time() + 10
    os.utime(xplane, (later, later))  # the same file captured again: analysed again
    assert diagnosed(client, "compare/naive")["state"] == "done" and calls == ["compare/naive"] * 2


def test_a_large_profile_shows_that_it_is_being_analysed_and_other_tabs_answer_meanwhile(logs):
    release, started = threading.Event(), threading.Event()

    def slow(run, root):
        started.set()
        assert release.wait(30)
        return {"diagnosis": {"verdict": "input-bound"}, "text": "", "headline": ""}

    tab, client = app(logs)
    tab._analyses._analyse = slow
    status, first = get_json(client, "/run", run="solo")
    assert status == 200 and first["state"] in ("queued", "analysing") and first["size_mb"] > 0
    assert started.wait(10)
    assert get_json(client, "/run", run="solo")[1]["state"] == "analysing"
    queued = get_json(client, "/run", run="mw")[1]  # one analysis at a time: the next one waits its turn
    assert queued["state"] == "queued"
    listing = client.get("/data/plugins_listing")
    assert listing.status_code == 200 and json.loads(listing.get_data())["diagnose"]["enabled"]
    assert get_json(client, "/runs")[0] == 200
    release.set()
    assert diagnosed(client, "solo")["state"] == "done"
    assert diagnosed(client, "mw")["state"] == "done"


def test_a_failed_analysis_is_reported_and_the_worker_goes_on(logs):
    tab, client = app(logs)

    def broken(run, root):
        if run.name == "solo":
            raise RuntimeError("the converter crashed")
        return {"diagnosis": {"verdict": "device-bound"}, "text": "", "headline": ""}

    tab._analyses._analyse = broken
    failed = diagnosed(client, "solo")
    assert failed["state"] == "failed" and "the converter crashed" in failed["error"]
    assert diagnosed(client, "mw")["state"] == "done"


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_a_read_only_log_folder_is_diagnosed_and_left_as_it_was(logs, tmp_path):
    frozen = tmp_path / "frozen"
    shutil.copytree(logs, frozen)
    before = _tree(frozen)
    modes = {}
    for path in [frozen, *frozen.rglob("*")]:
        modes[path] = path.stat().st_mode
        path.chmod(stat.S_IMODE(modes[path]) & ~0o222)
    try:
        _, client = app(frozen)
        for run in ("compare/naive", "mw/workers/worker-1", "solo"):
            found = diagnosed(client, run)
            assert found["state"] == "done" and found["diagnosis"]["verdict"] == "input-bound", found
        assert get_json(client, "/utilization", run="solo")[0] == 200
        assert get_json(client, "/compare", folder="compare")[0] == 200
        assert _tree(frozen) == before  # also as root, whom the permissions would not stop
    finally:
        for path, mode in modes.items():
            path.chmod(mode)


@pytest.mark.parametrize(
    "name",
    [
        "../logs/solo",
        "..",
        "solo/../mw",
        "/etc",
        "%2e%2e%2fsolo",
        "..%2F..%2Fetc",
        "solo/plugins/profile",
        "outside",
        "linked",
        "",
    ],
)
def test_a_name_the_walk_did_not_find_is_a_404(logs, tmp_path, name):
    outside = tmp_path / "outside"
    tab_logs.profile(outside)
    (logs / "linked").symlink_to(outside, target_is_directory=True)
    _, client = app(logs)
    for route, key in (("/run", "run"), ("/utilization", "run"), ("/compare", "folder"), ("/report.png", "folder")):
        response = client.get(ROUTE + route, query_string={key: name})
        assert response.status_code == 404, (route, name)
    absolute = client.get(ROUTE + "/run", query_string={"run": str(logs / "solo")})
    assert absolute.status_code == 404


@pytest.mark.parametrize(
    "raw",
    [
        "/run?run=%2e%2e%2fsolo",  # decodes to ../solo
        "/run?run=%2E%2E/%2E%2E/etc",
        "/run?run=solo%2F..%2F..%2Foutside",
        "/report.png?folder=%2e%2e",
        "/../../../etc/passwd",
        "/..%2f..%2fplugin.py",
        "/static/../plugin.py",
        "/loader.py",
    ],
)
def test_encoded_names_and_paths_out_of_the_tab_are_a_404(logs, raw):
    _, client = app(logs)
    assert client.get(ROUTE + raw).status_code == 404


def test_links_never_lead_out_of_the_log_folder(logs, tmp_path):
    outside = tmp_path / "outside"
    tab_logs.profile(outside / "run")
    tab_logs.report(outside / "compare")
    (logs / "linked-run").symlink_to(outside / "run", target_is_directory=True)
    (logs / "linked-compare").symlink_to(outside / "compare", target_is_directory=True)
    (logs / "solo" / "plugins" / "profile" / "2027_01_01_00_00_00").mkdir()
    (logs / "solo" / "plugins" / "profile" / "2027_01_01_00_00_00" / "host.xplane.pb").symlink_to(
        outside / "run/plugins/profile" / tab_logs.SESSION / "host.xplane.pb"
    )
    (logs / "mw" / "summary.json").symlink_to(tmp_path / "secret.json")
    (tmp_path / "secret.json").write_text(json.dumps({"utilization": {"cpu_utilization_percent": 1}}))
    _, client = app(logs)
    body = get_json(client, "/runs")[1]
    assert {run["name"] for run in body["runs"]} == {
        "compare/naive",
        "compare/optimized",
        "mw",
        "mw/workers/worker-1",
        "solo",
    }
    assert next(r for r in body["runs"] if r["name"] == "solo")["session"] == tab_logs.SESSION  # not the linked one
    assert [c["name"] for c in body["compares"]] == ["compare"]
    assert get_json(client, "/utilization", run="mw")[1]["summary"] is None


def test_utilization_comes_from_the_sampler_events_or_the_summary(logs, tmp_path):
    _, client = app(logs)
    status, usage = get_json(client, "/utilization", run="solo")
    assert status == 200 and usage["events"]["source"] == "solo/system"
    series = {line["name"]: line for line in usage["events"]["series"]}
    assert set(series) == {"CPU", "GPU (NVML)", "SM activity (GPM)"}
    assert series["GPU (NVML)"]["mean"] == 90.0 and len(series["CPU"]["points"]) == 20
    assert usage["summary"]["CPU"] == 55.0
    assert get_json(client, "/utilization", run="mw")[1] == {"run": "mw", "events": None, "summary": None}

    profiled = tmp_path / "profiled"  # step-doctor profile: logs/<run>/ and logs/utilization/ for the command
    tab_logs.profile(profiled / "train")
    tab_logs.samples(profiled / "utilization", count=600, gpu=False)
    usage = get_json(app(profiled)[1], "/utilization", run="train")[1]
    assert usage["events"]["source"] == "utilization"
    assert [line["name"] for line in usage["events"]["series"]] == ["CPU"]
    assert len(usage["events"]["series"][0]["points"]) <= 240


def test_a_compare_folder_side_by_side_with_its_picture(logs):
    _, client = app(logs)
    status, compared = get_json(client, "/compare", folder="compare")
    assert status == 200
    assert compared["names"] == ["naive", "optimized"] and compared["speedup"] == 2.48
    assert compared["runs"] == {"naive": "compare/naive", "optimized": "compare/optimized"}
    rows = {row[0]: row[1:] for row in compared["rows"]}
    assert rows["examples/s"] == ["1,493", "3,705"] and rows["waiting for input (profiler)"] == ["52.2 %", "1.4 %"]
    assert rows["device busy (profiler)"] == ["n/a", "n/a"]
    image = client.get(ROUTE + "/report.png", query_string={"folder": "compare"})
    assert image.status_code == 200 and image.get_data() == tab_logs.PNG
    assert image.headers["Content-Type"] == "image/png"
    (logs / "compare" / "report.json").write_text("{not json")
    status, body = get_json(client, "/compare", folder="compare")
    assert status == 422 and "report.json cannot be read" in body["error"]


def test_is_active_is_a_bounded_walk_whose_yes_is_kept(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    tab, _ = app(empty)
    assert not tab.is_active()
    tab_logs.profile(empty / "late")
    assert not tab.is_active()  # a "no" is rechecked only every INACTIVE_RECHECK_S
    monkeypatch.setattr(plugin, "INACTIVE_RECHECK_S", 0.0)
    tab.is_active()  # looks again, in the background
    deadline = time.monotonic() + 10
    while not tab.is_active() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tab.is_active()
    shutil.rmtree(empty / "late")
    monkeypatch.setattr(discovery, "has_any", lambda *a, **k: pytest.fail("a yes is not checked again"))
    assert tab.is_active()


def test_the_walk_is_bounded(tmp_path):
    deep = tmp_path / "deep"
    for index in range(50):
        (deep / f"folder{index:02d}").mkdir(parents=True)
    tab_logs.profile(deep / "folder49")
    assert not discovery.has_any(deep, limit=10)
    bounded = discovery.scan(deep, limit=10)
    assert not bounded.runs and bounded.truncated
    assert list(discovery.scan(deep).runs) == ["folder49"]


def test_no_tab_where_tensorboard_reads_a_remote_log_folder():
    tab, _ = app(Path("/nonexistent"))
    assert not tab.is_active()
    assert not plugin.DiagnosePlugin(plugin.base_plugin.TBContext(logdir="gs://bucket/runs")).is_active()


def test_finished_diagnoses_are_forgotten_oldest_first(logs):
    kept = analyses.Analyses(logs.resolve(), analyse=lambda run, root: {"diagnosis": {}}, keep=2)
    runs = list(discovery.scan(logs).runs.values())
    for run in runs:
        kept.state(run)
        deadline = time.monotonic() + 10
        while kept.state(run)["state"] != "done" and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(kept._entries) == 2
