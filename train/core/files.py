"""Outputs that are never half-written, and the project's own files from any working directory.

Every file a run or a report writes goes through `atomic_write`: the content goes to a
temporary sibling first and is renamed into place, so a reader (or a crash) never sees a
partial file. TensorBoard scalars go through `scalar_writer`/`write_scalars`, so every event
file of the project is written the same way. Nothing here imports TensorFlow at module level:
`diagnose` and the reports run without it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

# The checkout (or the editable install) this package lives in: configs/ and data/ are there.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def project_file(path: str | Path) -> Path:
    """`path` as given when it exists here, else the project's own file of that name.

    So `--config configs/optimized.yaml` and the built-in dataset work from any directory.
    """
    path = Path(path)
    if path.is_absolute() or path.exists():
        return path
    shipped = PROJECT_ROOT / path
    return shipped if shipped.exists() else path


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp)` on a temporary sibling of `path` (same suffix), then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.tmp{path.suffix}")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, payload: dict) -> None:
    write_text(path, json.dumps(payload, indent=2, default=str) + "\n")


def scalar_writer(logdir: Path, suffix: str | None = None):
    """A TensorBoard event-file writer for `logdir` (one TensorBoard run)."""
    import tensorflow as tf

    return tf.summary.create_file_writer(str(logdir), filename_suffix=suffix)


def write_scalars(logdir: Path, points: Iterable[tuple[str, float, int]], suffix: str | None = None) -> None:
    """Write (tag, value, step) points into one TensorBoard run and close it; None values are skipped."""
    import tensorflow as tf

    writer = scalar_writer(logdir, suffix)
    with writer.as_default():
        for tag, value, step in points:
            if value is not None:
                tf.summary.scalar(tag, value, step=step)
    writer.close()
