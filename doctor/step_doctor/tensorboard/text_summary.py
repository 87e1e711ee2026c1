"""The verdict for TensorBoard's own Text tab, where the Diagnose tab is not installed.

`step-doctor profile` writes each run's diagnosis into the run's folder, and the template's
`compare` the comparison and both runs' verdicts, as text summaries: Markdown, which the Text tab
renders, tables included. Written with TensorBoard's record writer and protos, as the sampler
writes its scalars (sampler.py): TensorBoard's EventFileWriter would import TensorFlow.

Each call replaces the summaries an earlier call wrote into the same folder (files ending in
SUFFIX), so running compare again leaves one verdict per run, not one per attempt. Writing is a
courtesy: a folder that cannot be written gets a warning, never a failed command.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from step_doctor import diagnose as analyser
from step_doctor.diagnose.diagnosis import Diagnosis, RunDiagnosis, UnreadableRun
from step_doctor.errors import UserError
from step_doctor.tensorboard import comparison

SUFFIX = ".step-doctor"
DIAGNOSIS_TAG = "step_doctor/diagnosis"
COMPARISON_TAG = "step_doctor/comparison"
# The figures a summary compares, as the Compare view shows them (comparison.ROWS): throughput and utilization.
SUMMARIZED = {"examples_per_sec", "step_time_ms", "input_bound_percent", "device_busy_percent"}
SUMMARIZED |= {"gpu_utilization_percent", "sm_activity_percent", "cpu_utilization_percent"}
COMPARED = tuple(row for row in comparison.ROWS if row[1] in SUMMARIZED)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _figure(value, digits: int, unit: str) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}{unit}"


def diagnosis_markdown(run: str, item: RunDiagnosis | UnreadableRun) -> str:
    """One run's diagnosis: the summary line, the ranked recommendations as a table, the first fix, the notes."""
    headline = analyser.render(Diagnosis("", {run: item})).splitlines()[0]
    lines = [f"**{_cell(headline)}**", ""]
    if not isinstance(item, RunDiagnosis):
        return "\n".join(lines + [_cell(item.error)])
    if item.unmeasured:
        lines += [f"Not measured: {item.unmeasured}", ""]
    ranked = item.recommendations
    if ranked:
        lines += ["| # | recommendation | removes per step | estimated gain |", "|---:|---|---:|---:|"]
        for rank, found in enumerate(ranked, start=1):
            removed = f"{found.removes_ms:.1f} ms ({found.score:.0f} %)"
            lines.append(f"| {rank} | {_cell(found.title)} | {removed} | {found.estimated_gain:.2f}x |")
        lines += ["", f"**First fix:** {ranked[0].fix}", "", f"Evidence: {ranked[0].evidence}", ""]
        where = ranked[0].built_at
        if where:
            lines += [f"Built at `{where.short()}`: `{_cell(where.code)}`", ""]
        proved = [(found, proof) for found in ranked for proof in found.proofs]
        for found, proof in proved:
            lines += [f"- Measured by running it, {_cell(found.title)}: {_cell(proof.label)}, {_cell(proof.text)}"]
        lines += [""] if proved else []
    for found in item.latent:
        lines += [f"- Latent: **{found.title}**. {found.if_faster or found.evidence}"]
    for note in item.notes:
        lines += [f"- {note}"]
    return "\n".join(lines).strip() + "\n"


def comparison_markdown(report: dict, document: Diagnosis | None) -> str:
    """compare's runs side by side, with each run's verdict and first fix where it was diagnosed."""
    names = list(report["runs"])
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label, key, digits, unit in COMPARED:
        cells = [_figure((report["runs"][n] or {}).get(key), digits, unit) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    runs = document.runs if document else {}
    verdicts, firsts = [], []
    for name in names:
        item = runs.get(name)
        first = item.recommendations[0] if item and item.recommendations else None
        verdicts.append((item.verdict if item else "n/a").upper())
        firsts.append(f"{_cell(first.title)} ({first.estimated_gain:.2f}x)" if first else "none")
    lines += ["| verdict | " + " | ".join(verdicts) + " |", "| first fix | " + " | ".join(firsts) + " |"]
    if report.get("speedup"):
        lines += ["", f"**Speedup: {report['speedup']:.2f}x** examples/s ({names[-1]} / {names[0]})."]
    return "\n".join(lines) + "\n"


def _write(folder: Path, tag: str, markdown: str) -> Path | None:
    """One event file holding the text summary, replacing this module's earlier ones in that folder."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.text.summary_v2 import text_pb
    from tensorboard.summary.writer.record_writer import RecordWriter

    try:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob(f"events.out.tfevents.*{SUFFIX}"):
            old.unlink()
        path = folder / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}{SUFFIX}"
        with open(path, "wb") as file:
            records = RecordWriter(file)
            records.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
            summary = text_pb(tag, markdown, description="Written by step-doctor: the diagnosis of this run's profile.")
            records.write(event_pb2.Event(wall_time=time.time(), step=0, summary=summary).SerializeToString())
        return path
    except OSError as error:
        print(
            f"warning: could not write the verdict for TensorBoard's Text tab into {folder}: {error}", file=sys.stderr
        )
        return None


def write_diagnosis(logdir: Path, document: Diagnosis) -> list[Path]:
    """Each diagnosed run's verdict, as a text summary in its own folder (its run in the Text tab)."""
    written = []
    for run, item in document.runs.items():
        path = _write(Path(logdir) / run, DIAGNOSIS_TAG, diagnosis_markdown(run, item))
        written += [path] if path else []
    return written


def write_comparison(folder: Path, report: dict) -> list[Path]:
    """compare's folder: its runs diagnosed (each verdict into its run), the side-by-side table into the folder."""
    folder = Path(folder)
    try:
        document = analyser.diagnose(folder)
    except UserError:  # the runs were made without a profile: the table still stands
        document = None
    written = write_diagnosis(folder, document) if document else []
    path = _write(folder, COMPARISON_TAG, comparison_markdown(report, document))
    return written + ([path] if path else [])
