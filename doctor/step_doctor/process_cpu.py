"""The CPU the profiled process used during the profile's window, written beside the profile.

A trace shows where each thread spent its time, not how much of the machine the process used: a
thread inside an op may be waiting for a core, a Python function may sleep, and Eigen's workers
leave no events. The doctor's estimates need that budget (diagnose/cpu_budget.py): on a host
whose cores are all busy, a fix that overlaps work gains nothing and one that removes work gains
the cores it frees. So the window's process CPU time (every thread, user and system:
time.process_time) and wall time are read when the profiler has started and before it stops (stopping
writes the profile, which is not the steps' work), with the cores the process may run on, into
<run>/process_cpu.json. Standard library only: it runs inside the user's process (profile/site/capture.py loads
it by its path; callbacks.py imports it).
"""

from __future__ import annotations

import json
import os
import time

FILE = "process_cpu.json"


def _cpu_seconds() -> float:
    # every thread's, in seconds at ns resolution (os.times counts clock ticks of 10 ms; a window can be 50 ms)
    return time.process_time()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Window:
    """Started when the profiler has started, stopped before it stops, written once the profile is."""

    def __init__(self):
        self.started: tuple[float, float] | None = None
        self.stopped: tuple[float, float] | None = None

    def start(self) -> None:
        self.started, self.stopped = (time.monotonic(), _cpu_seconds()), None

    def stop(self) -> None:
        if self.started is not None and self.stopped is None:
            self.stopped = (time.monotonic(), _cpu_seconds())

    def figures(self) -> dict | None:
        if self.started is None or self.stopped is None or self.stopped[0] <= self.started[0]:
            return None
        try:
            load = os.getloadavg()
        except (AttributeError, OSError):
            load = None
        return {
            "version": 1,
            "wall_s": round(self.stopped[0] - self.started[0], 6),
            "cpu_s": round(self.stopped[1] - self.started[1], 6),
            "cores": _cores(),
            "host_cores": os.cpu_count(),
            "load_1m": round(load[0], 2) if load else None,
        }

    def write(self, run_dir: str) -> None:
        """Atomically; nothing where the window never closed (a failed start, a process that died in it)."""
        path = os.path.join(run_dir, FILE)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            found = self.figures()
            if found is None:
                return
            os.makedirs(run_dir, exist_ok=True)
            with open(tmp, "w") as out:
                json.dump(found, out)
            os.replace(tmp, path)
        except OSError:
            pass  # never fail the user's script over a figure
