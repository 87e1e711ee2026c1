"""Log folders for the Diagnose tab's tests, laid out as the template and `step-doctor profile` lay them out,
each profile a copy of one real capture (tests/record_tab_profile.py), and the tab's app to ask them."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

from tensorboard.backend import application
from tensorboard.plugins import base_plugin
from werkzeug.test import Client

from step_doctor.sampler import SampleWriter
from step_doctor.tensorboard.loader import DiagnoseLoader
from tests.record_tab_profile import FIXTURE

SESSION = "2026_01_02_03_04_05"
ROUTE = "/data/plugin/diagnose"
# The smallest valid PNG (1x1): what the report route serves is compared byte for byte.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
)


def profile(run: Path, session: str = SESSION, host: str = "host") -> Path:
    """run/plugins/profile/<session>/<host>.xplane.pb, the recorded input-bound capture."""
    folder = run / "plugins" / "profile" / session
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{host}.xplane.pb"
    path.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    return path


def samples(folder: Path, count: int = 20, gpu: bool = True) -> Path:
    """The sampler's scalars: CPU, and one GPU's utilization and SM activity when `gpu`."""
    writer = SampleWriter(folder, ".monitor")
    start = time.time() - count
    rows = [
        {
            "time": start + i,
            "cpu_percent": 40.0 + i,
            "gpus": [{"utilization_percent": 90.0, "sm_activity_percent": 30.0}] if gpu else [],
        }
        for i in range(count)
    ]
    writer.write(rows)
    writer.close()
    return writer.path


def report(folder: Path) -> None:
    """What `python -m train compare` writes beside its two runs: report.json and report.png."""
    row = {"input_bound_percent": 52.2, "device_busy_percent": None, "cpu_utilization_percent": 94.6}
    document = {
        "device": "CPU only (2 cores)",
        "model": "tiny",
        "scenario": None,
        "speedup": 2.48,
        "runs": {
            "naive": {**row, "examples_per_sec": 1493.4, "pipeline": "python generator -> no prefetch"},
            "optimized": {**row, "examples_per_sec": 3704.8, "input_bound_percent": 1.4, "run_dir": "/elsewhere/x"},
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(document))
    (folder / "report.png").write_bytes(PNG)


def logdir(root: Path) -> Path:
    """compare/{naive,optimized} with a report, a two-worker run, and a run with samples and a summary."""
    for name in ("compare/naive", "compare/optimized", "mw", "mw/workers/worker-1", "solo"):
        profile(root / name)
    report(root / "compare")
    samples(root / "solo" / "system")
    (root / "solo" / "summary.json").write_text(
        json.dumps({"device_kind": "cpu", "utilization": {"cpu_utilization_percent": {"mean": 55.0}}})
    )
    return root


def app(folder: Path, loader=DiagnoseLoader):
    """The tab alone in TensorBoard's WSGI app, as TensorBoard builds it, and a client for it."""
    plugin = loader().load(base_plugin.TBContext(logdir=str(folder)))
    return plugin, Client(application.TensorBoardWSGI([plugin]))


def get_json(client: Client, route: str, **params):
    response = client.get(ROUTE + route, query_string=params)
    return response.status_code, json.loads(response.get_data())


def diagnosed(client: Client, run: str, timeout: float = 60) -> dict:
    """The run's diagnosis once the background analysis finished (the tab's own polling)."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = get_json(client, "/run", run=run)
        assert status == 200, body
        if body["state"] in ("done", "failed") or time.monotonic() > deadline:
            return body
        time.sleep(0.05)
