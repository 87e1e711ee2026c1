"""Where one command leaves a result that another command reads: defined once, for both sides."""

from __future__ import annotations

from pathlib import Path

SWEEP_FOLDER = "sweep-batch"  # under runs_dir: where `make sweep-batch` writes (its default --out)
SWEEP_RESULT = "sweep.json"  # in that folder: the points and the largest batch that fit


def sweep_result(runs_dir: str | Path) -> Path:
    """The last batch-size sweep's result under `runs_dir`, which an out-of-memory error reads."""
    return Path(runs_dir) / SWEEP_FOLDER / SWEEP_RESULT
