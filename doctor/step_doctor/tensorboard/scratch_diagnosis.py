"""One run's diagnosis, made without writing into the log folder.

diagnose() hands the profile to xprof's converter, which writes cache files
(ALL_HOSTS.op_stats_v2.pb) beside the xplane.pb it reads. A log folder is often read-only for the
TensorBoard that serves it (Compose mounts runs/ read-only; a shared results disk), and a viewer
must not change what it views anyway. So the run is analysed through a mirror: a temporary folder
of symbolic links to the run's profile files and the records diagnose reads beside them
(RECORDS, in the run's folder and the one above), laid out as diagnose expects.
The converter's cache lands in the mirror, which is removed afterwards; the links are removed,
never their targets.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

from step_doctor import diagnose as analyser
from step_doctor.diagnose.diagnosis import Diagnosis, RunDiagnosis, UnreadableRun
from step_doctor.tensorboard.discovery import Run, regular_file

# what diagnose reads beside a profile: the run's summary and config (diagnose/device.py, report.py), and what
# `step-doctor profile` and the template's profiler write there: the lines that built the datasets, the proofs, the
# process CPU over the window (dataset_sources.py, proofs.py, cpu_budget.py)
RECORDS = ("summary.json", "config.yaml", "dataset_sources.json", "proofs.json", "process_cpu.json")


def _link_records(source: Path, target: Path) -> None:
    for name in RECORDS:
        path = source / name
        if regular_file(path):
            (target / name).symlink_to(path)


def build(run: Run, root: Path, workspace: Path) -> Path:
    """The mirror of `run` inside workspace; returns the mirrored run folder to diagnose."""
    inner = workspace / "parent" / "run"
    session = inner / "plugins" / "profile" / run.session.name
    session.mkdir(parents=True)
    for xplane in run.xplanes:
        (session / xplane.name).symlink_to(xplane)
    _link_records(run.folder, inner)
    if run.folder != root:  # the folder above holds the summary of a run whose profile is in run/train/
        _link_records(run.folder.parent, inner.parent)
    return inner


def _finite(value):
    """NaN and infinity as null: the browser's JSON.parse rejects them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _relocated(document: dict, mirrored: Path, real: Path) -> dict:
    """The document with the mirror's paths replaced by the run's own."""
    text = json.dumps(_finite(document), default=str)
    for old, new in ((mirrored, real), (mirrored.parent, real.parent)):
        text = text.replace(json.dumps(str(old))[1:-1], json.dumps(str(new))[1:-1])
    return json.loads(text)


def _headline(text: str, run: Run, item: RunDiagnosis | UnreadableRun) -> str:
    """The summary line the command line prints for the run, without the run's name and verdict."""
    first = text.splitlines()[0].removeprefix(f"{run.name}: ") if text else ""
    return first.removeprefix(f"{item.verdict.upper()}, ")


def analyse(run: Run, root: Path) -> dict:
    """{"diagnosis": the run's entry of diagnose()'s document, "text": what `step-doctor diagnose` prints for
    it, "headline": its summary line}."""
    workspace = Path(tempfile.mkdtemp(prefix="step-doctor-tab-"))
    try:
        mirrored = build(run, root, workspace)
        document = analyser.diagnose(mirrored)
        item = next(iter(document.runs.values()))
        text = analyser.render(Diagnosis(str(root), {run.name: item}))
        found = _relocated(
            {"diagnosis": item.to_json(), "text": text, "headline": _headline(text, run, item)}, mirrored, run.folder
        )
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return found
