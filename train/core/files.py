"""Outputs that are never half-written, and the project's own files from any working directory.

Every file a run or a report writes goes through `atomic_write`: the content goes to a
temporary sibling first and is renamed into place, so a reader (or a crash) never sees a
partial file. TensorBoard scalars go through `scalar_writer`/`write_scalars`, so every event
file of the project is written the same way. Nothing here imports TensorFlow at module level:
`diagnose` and the reports run without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from step_doctor.files import atomic_write, write_json, write_text

__all__ = ["PROJECT_ROOT", "atomic_write", "project_file", "scalar_writer", "write_json", "write_scalars", "write_text"]

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
