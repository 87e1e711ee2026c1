"""Outputs that are never half-written: the content goes to a temporary sibling first and is renamed into
place, so a reader (or a crash) never sees a partial file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


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
