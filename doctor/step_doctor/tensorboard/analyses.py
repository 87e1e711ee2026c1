"""Each profile analysed once, in the background, one at a time, while TensorBoard keeps answering.

A diagnosis is cached under the profile's identity: its files' paths, sizes and modification times
(discovery.Run.key), so a run profiled again is analysed again and an unchanged one never is. The
first request for a profile queues it and answers at once with its state ("queued", then
"analysing"); the tab polls until it is "done" or "failed". One worker thread: a GB profile takes
hundreds of MB while it is read, and two at once on a small machine would slow both. The thread is
a daemon, so stopping TensorBoard never waits for an analysis to finish.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from step_doctor.errors import UserError
from step_doctor.tensorboard import scratch_diagnosis
from step_doctor.tensorboard.discovery import Run

logger = logging.getLogger(__name__)
KEEP = 64  # finished diagnoses kept (each is tens of KB)


@dataclass
class Entry:
    run: str
    size_mb: float
    state: str = "queued"  # queued -> analysing -> done | failed
    queued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    finished_at: float | None = None
    found: dict | None = None  # scratch_diagnosis.analyse's answer
    error: str | None = None

    def public(self) -> dict:
        now = time.monotonic()
        seconds = None
        if self.started_at is not None:
            seconds = round((self.finished_at or now) - self.started_at, 1)
        return {
            "state": self.state,
            "size_mb": round(self.size_mb, 2),
            "seconds": seconds,
            "waited": round((self.started_at or now) - self.queued_at, 1),
            "error": self.error,
            **(self.found or {}),
        }


class Analyses:
    def __init__(self, root: Path, analyse: Callable[[Run, Path], dict] = scratch_diagnosis.analyse, keep: int = KEEP):
        self._root = root
        self._analyse = analyse
        self._keep = keep
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, Entry] = OrderedDict()
        self._queue: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None

    def state(self, run: Run) -> dict:
        """The run's diagnosis or how far it is; queues the profile the first time it is asked for."""
        key = run.key()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = Entry(run.name, run.size_mb())
                self._queue.put((key, run))
                self._start()
            self._entries.move_to_end(key)
            self._forget_old()
            return entry.public()

    def _start(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="step-doctor-diagnose", daemon=True)
            self._worker.start()

    def _forget_old(self) -> None:
        finished = [key for key, entry in self._entries.items() if entry.state in ("done", "failed")]
        for key in finished[: max(0, len(finished) - self._keep)]:
            del self._entries[key]

    def _work(self) -> None:
        while True:
            key, run = self._queue.get()
            with self._lock:
                entry = self._entries.get(key)
                if entry is None:
                    continue
                entry.state, entry.started_at = "analysing", time.monotonic()
            found, error = None, None
            try:
                found = self._analyse(run, self._root)
            except UserError as raised:  # no readable profile: said plainly, as the command line says it
                error = str(raised)
            except Exception as raised:  # noqa: BLE001 (a failed analysis must not stop the worker for other runs)
                logger.exception("step-doctor: diagnosing %s failed", run.name)
                error = f"{type(raised).__name__}: {raised}"
            with self._lock:
                entry.found, entry.error = found, error
                entry.state = "failed" if error else "done"
                entry.finished_at = time.monotonic()
