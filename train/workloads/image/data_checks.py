"""The dataset checked before a run, and a failed run's data named: which shard, which record.

Before the first step: every shard's framing, CRCs and record count (data.verify), so a damaged
file stops the run before anything is written; or, with pipeline.skip_corrupt, a full scan that
finds the readable records to train on. When a run fails inside TensorFlow on its data, the
shards are scanned to say which record it was (TensorFlow's reader names a byte offset only).
"""

from __future__ import annotations

import dataclasses

from train.core.errors import UserError
from train.shards import integrity
from train.shards.spec import DatasetSpec


@dataclasses.dataclass
class Readable:
    """What a skip_corrupt scan found: the readable records of damaged shards, and what was skipped."""

    damaged: dict = dataclasses.field(default_factory=dict)  # shard -> its readable records
    skipped: list = dataclasses.field(default_factory=list)  # integrity.Problem, one per skipped record


def verify(cfg, spec: DatasetSpec, build_hint: str) -> None:
    """Raise a clear error when a shard is damaged (unless the run skips damaged records)."""
    if cfg.data.verify and not cfg.pipeline.skip_corrupt:
        problems = integrity.verify(spec)
        if problems:
            raise damaged_error(spec, problems, build_hint)


def readable(cfg, spec: DatasetSpec) -> Readable:
    """With pipeline.skip_corrupt: scan every record, keep the readable ones of damaged shards."""
    if not cfg.pipeline.skip_corrupt:
        return Readable()
    scans = integrity.scan_dataset(spec)
    return Readable(
        damaged={path: scan.good for path, scan in scans.items() if scan.problems},
        skipped=[problem for scan in scans.values() for problem in scan.problems],
    )


def damaged_error(spec: DatasetSpec, problems: list, build_hint: str) -> UserError:
    return UserError(
        f"The dataset at {spec.root} is damaged: {integrity.describe(problems)}. Rebuild it (delete {spec.root} "
        f"and run {build_hint}), or set pipeline.skip_corrupt=true to train on the readable records (the count of "
        "skipped records goes into summary.json and TensorBoard)."
    )


def data_error(error: Exception, spec: DatasetSpec, build_hint: str) -> Exception:
    """A clear error naming the damaged shard and record, when the data is what failed; else `error`."""
    problems = [p for scan in integrity.scan_dataset(spec).values() for p in scan.problems]
    return damaged_error(spec, problems, build_hint) if problems else error
