"""What the tab can show: the runs under the log folder that hold a profile, and the compare folders.

A request names a run or a folder only by the name this walk gave it; the plugin looks the name up
here and never joins a request's text onto a path, so `../`, absolute paths and their URL-encoded
forms find nothing. The walk never follows a symbolic link, and a profile file is taken only when it
is a regular file: a link inside the log folder cannot lead the tab to files outside it.

The walk is bounded (MAX_FOLDERS) because it runs in TensorBoard's process whenever the tab lists
runs, and a log folder may hold checkpoints, datasets or a whole home directory by mistake.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

PROFILE_SUFFIX = ".xplane.pb"
REPORT = "report.json"  # what `python -m train compare` writes beside its runs
MAX_FOLDERS = 20_000
MAX_DEPTH = 12
SKIPPED = {"checkpoints", "__pycache__", "node_modules", ".git"}  # never hold a profile; can be large
# The template's multi-worker runs put every worker but the chief under <run>/workers/<task>/.
WORKER = re.compile(r"^(?P<group>.+)/workers/(?P<task>[^/]+)$")


@dataclass(frozen=True)
class Run:
    name: str  # the run's folder relative to the log folder ("." for the log folder itself), as diagnose names it
    folder: Path
    session: Path  # the newest capture, as diagnose picks it (session folders are named by capture time)
    xplanes: tuple[Path, ...]
    group: str  # the run this one belongs to: itself, or the chief's run for another worker of a multi-worker run
    role: str  # "" for a single run; "chief" or the worker's task name in a multi-worker run

    def key(self) -> tuple:
        """What changes when the profile changes: the files' paths, sizes and modification times."""
        found = []
        for path in self.xplanes:
            info = path.stat()
            found.append((str(path), info.st_size, info.st_mtime_ns))
        return tuple(found)

    def size_mb(self) -> float:
        return sum(path.stat().st_size for path in self.xplanes) / 1e6


@dataclass(frozen=True)
class CompareFolder:
    name: str
    folder: Path
    report: Path
    image: Path | None  # report.png, where compare drew one


@dataclass
class Listing:
    runs: dict[str, Run] = field(default_factory=dict)
    compares: dict[str, CompareFolder] = field(default_factory=dict)
    truncated: bool = False  # the walk stopped at MAX_FOLDERS


def regular_file(path: Path) -> bool:
    """A file that is itself a regular file, not a link to one (that could lead out of the log folder)."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as found:
            return sorted(found, key=lambda entry: entry.name)
    except OSError:  # unreadable, or removed while the walk ran
        return []


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode)
    except OSError:
        return False


def _sessions(names: dict[str, os.DirEntry]) -> list[tuple[Path, tuple[Path, ...]]]:
    """The folder's plugins/profile/* sessions holding at least one regular .xplane.pb file, in name order."""
    plugins = names.get("plugins")
    if plugins is None or not _is_folder(plugins):
        return []
    profile = [e for e in _entries(Path(plugins.path)) if e.name == "profile" and _is_folder(e)]
    found = []
    for entry in _entries(Path(profile[0].path)) if profile else []:
        if _is_folder(entry):
            files = tuple(
                Path(e.path) for e in _entries(Path(entry.path)) if e.name.endswith(PROFILE_SUFFIX) and _is_file(e)
            )
            if files:
                found.append((Path(entry.path), files))
    return found


def _walk(root: Path, limit: int):
    """(folder, its entries, name relative to root) for every folder under root, top-down, links not followed."""
    stack, seen = [(root, ".", 0)], 0
    while stack:
        folder, name, depth = stack.pop()
        seen += 1
        if seen > limit:
            yield None
            return
        entries = _entries(folder)
        yield folder, entries, name
        if depth >= MAX_DEPTH:
            continue
        children = [e for e in entries if _is_folder(e) and e.name not in SKIPPED]
        for entry in reversed(children):
            child = entry.name if name == "." else f"{name}/{entry.name}"
            stack.append((Path(entry.path), child, depth + 1))


def _roles(runs: dict[str, Run]) -> dict[str, Run]:
    """Name each worker of a multi-worker run: its chief's run folder and its task."""
    groups = {m["group"]: m for name in runs if (m := WORKER.match(name)) and m["group"] in runs}
    named = {}
    for name, run in runs.items():
        match = WORKER.match(name)
        if match and match["group"] in runs:
            named[name] = Run(name, run.folder, run.session, run.xplanes, match["group"], match["task"])
        elif name in groups:
            named[name] = Run(name, run.folder, run.session, run.xplanes, name, "chief")
        else:
            named[name] = run
    return named


def scan(logdir: Path, limit: int = MAX_FOLDERS) -> Listing:
    """Every run with a profile and every compare folder under logdir."""
    root = Path(logdir).resolve()
    listing = Listing()
    runs = {}
    for item in _walk(root, limit):
        if item is None:
            listing.truncated = True
            break
        folder, entries, name = item
        names = {e.name: e for e in entries}
        if REPORT in names and _is_file(names[REPORT]):
            image = names.get("report.png")
            listing.compares[name] = CompareFolder(
                name, folder, folder / REPORT, folder / "report.png" if image and _is_file(image) else None
            )
        sessions = _sessions(names)
        if sessions:
            session, xplanes = sessions[-1]
            runs[name] = Run(name, folder, session, xplanes, name, "")
    listing.runs = _roles(runs)
    return listing


def has_any(logdir: Path, limit: int = 2_000) -> bool:
    """Whether a profile or a compare report is under logdir, stopping at the first (for is_active)."""
    root = Path(logdir)
    if not root.is_dir():
        return False
    for item in _walk(root, limit):
        if item is None:
            return False
        _, entries, _ = item
        names = {e.name: e for e in entries}
        if REPORT in names and _is_file(names[REPORT]):
            return True
        if _sessions(names):
            return True
    return False
