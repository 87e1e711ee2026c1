"""The one way every benchmark chart is drawn and saved: headless, atomically, then closed."""

from __future__ import annotations

from pathlib import Path

from train.core import files

DPI = 110
KEPT, NOT_KEPT, SLOWER, WITHIN = "#2ca02c", "#7f7f7f", "#d62728", "#bcbd22"


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), imported only when a chart is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:
    """Write `fig` to `path` (never half-written) and free it."""
    files.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=DPI))
    pyplot().close(fig)
