"""The CPU a step needs against the cores it has: what bounds the step after a fix.

A fix changes a step in two ways. It shortens the wait on a stage (parallel calls, prefetch and
parallel reads overlap or spread work; the wait is what the trace charges to the stage), and it
may remove work (a cache after a decode removes the decode's core-ms from every epoch after the
first; tokenizing once removes the tokenizer's). What the step can reach is bounded by the cores:
the core-ms per step that remain, spread over the cores the process may use. On a host whose
cores are all busy, overlapping gains nothing (the work only moves) and removing work gains the
cores it frees, for the model too where it runs on them (a CPU-only host): the rest of the step
was measured while the pipeline took cores from it, and gets back the share the fix frees.

So, for a step of T ms on C cores that used U core-ms, a fix that shortens the wait by L ms and
removes R core-ms is estimated at
    T' = max(max(U - R, X if R else 0) / C,  T - L - X * u * R / U,  floor)
where X is the rest of the step (T less its input wait), u the share of the cores busy
(U / (C T)), and floor what a device keeps busy per step (a GPU host). X / C: the rest of the
step, measured while the pipeline took cores from it, at best spreads over all of them once a fix
frees them; U - R alone is a small difference of two large figures where a fix removes most of
the work, and would promise more than the cores give. U is the process CPU that
`step-doctor profile` and the template's profiler recorded over the profile's window
(process_cpu.json beside it, step_doctor/process_cpu.py); where there is none, the trace's own
figures stand in (the pipeline's function work and the model's compute and overhead, one core
each): a lower bound, so a host that bound shows busy is busy, and one it does not is taken as
having cores to spare.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

FILE = "process_cpu.json"

BUSY = 0.9  # a host whose cores are this busy has none to spare: overlap gains nothing there


@dataclass(frozen=True)
class ProcessCpu:
    """What the profiled process used over its profile's window (step_doctor/process_cpu.py)."""

    wall_s: float
    cpu_s: float
    cores: int
    host_cores: int | None = None
    load_1m: float | None = None

    @property
    def utilization(self) -> float:
        return self.cpu_s / (self.wall_s * self.cores) if self.wall_s > 0 and self.cores else 0.0

    @classmethod
    def beside(cls, session: Path) -> ProcessCpu | None:
        path = session.parent.parent.parent / FILE
        try:
            found = json.loads(path.read_text())
            record = cls(
                float(found["wall_s"]),
                float(found["cpu_s"]),
                int(found["cores"]),
                found.get("host_cores"),
                found.get("load_1m"),
            )
        except (OSError, ValueError, TypeError, KeyError):
            return None
        return record if record.wall_s > 0 and record.cores > 0 and record.cpu_s >= 0 else None

    def to_json(self) -> dict:
        return {
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "cores": self.cores,
            "host_cores": self.host_cores,
            "load_1m": self.load_1m,
            "utilization": round(self.utilization, 3),
        }


class Removal(float):
    """The step time a fix removes, with what it is made of: the wait it shortens and the core-ms it removes (so
    that fixes can be estimated together: Budget.together)."""

    def __new__(cls, removed_ms: float, wait_ms: float = 0.0, work_ms: float = 0.0, covers_below: bool = False):
        found = super().__new__(cls, removed_ms)
        found.wait_ms, found.work_ms = wait_ms, work_ms
        found.covers_below = covers_below  # a cache: its wait and work count the stages under its own
        return found


@dataclass(frozen=True)
class Budget:
    """One profile's step against its cores, per step (ms and core-ms)."""

    step_ms: float  # T: the working step (stalls.working_step)
    rest_ms: float  # X: the step less its input wait
    cores: int  # C
    core_ms: float  # U
    measured: bool  # U from the process's CPU time, not the trace's lower bound
    floor_ms: float = 0.0  # what a device keeps busy per step
    traced_ms: float = 0.0  # the pipeline's function work and the rest of the step, as the trace times them

    @property
    def deflation(self) -> float:
        """The share of traced work that was CPU: a thread inside a call is timed while it waits for a core, so on
        a host asked for more than its cores the trace times more work than the process used."""
        return min(self.core_ms / self.traced_ms, 1.0) if self.traced_ms > 0 and self.measured else 1.0

    @property
    def busy(self) -> float:
        """u: the share of the cores the process kept busy."""
        return min(self.core_ms / (self.cores * self.step_ms), 1.0) if self.step_ms and self.cores else 0.0

    @property
    def saturated(self) -> bool:
        return self.busy >= BUSY

    def step_after(self, wait_ms: float = 0.0, work_ms: float = 0.0) -> float:
        """T': the step after a fix that shortens the input wait by `wait_ms` and removes `work_ms` core-ms."""
        T, U = self.step_ms, self.core_ms
        work = min(max(work_ms, 0.0) * self.deflation, U)
        relief = self.rest_ms * self.busy * work / U if U else 0.0
        by_latency = T - max(wait_ms, 0.0) - relief
        # what is left over the cores; and the rest of the step, measured while the pipeline took cores from it, at
        # best spread over all of them once they are free (the remainder U - work is a small difference of two
        # large figures where a fix removes most of the work: this keeps it from promising more than the cores give)
        by_cores = max(U - work, self.rest_ms if work else 0.0) / self.cores
        return max(by_latency, by_cores, self.floor_ms, 0.0)

    def removes(self, wait_ms: float = 0.0, work_ms: float = 0.0, covers_below: bool = False) -> Removal:
        """The step time the fix removes (T - T'): what a recommendation scores and gains by."""
        return Removal(max(self.step_ms - self.step_after(wait_ms, work_ms), 0.0), wait_ms, work_ms, covers_below)

    def together(self, parts: list[tuple[str | None, float, float, bool]], input_ms: float) -> Removal:
        """The step time several fixes remove together, each (stage, wait, work, covers_below): on one stage the
        larger wait and work count (a cache after a map and its parallel calls remove one wait), over stages they add
        up, the waits on stages to at most the input wait `input_ms`; a fix of no stage (per-step overhead) adds its
        own. A cache's wait and work count the stages under it (Blame.cached), so a fix under one counts once."""
        waits: dict = {}
        works: dict = {}
        covering = set()
        for stage, wait, work, covers in parts:
            waits[stage] = max(waits.get(stage, 0.0), wait)
            works[stage] = max(works.get(stage, 0.0), work)
            if covers and stage:
                covering.add(stage)
        own = waits.pop(None, 0.0)
        nested = {s for s in works if s and any(s != t and s.startswith(t + "::") for t in covering)}
        work = sum(w for s, w in works.items() if s not in nested)
        return self.removes(min(sum(w for s, w in waits.items() if s not in nested), input_ms) + own, work)

    @property
    def words(self) -> str:
        """The budget, said once in an estimate's caveat."""
        source = (
            "measured: the process's CPU time over the profile's window"
            if self.measured
            else "at least: the trace's own figures, with no process_cpu.json beside the profile to measure it"
        )
        return (
            f"the step used {self.core_ms:.1f} core-ms of {self.cores} cores' {self.cores * self.step_ms:.1f}, "
            f"{self.busy:.0%} busy ({source})"
        )

    def to_json(self) -> dict:
        return {
            "step_ms": round(self.step_ms, 3),
            "rest_ms": round(self.rest_ms, 3),
            "cores": self.cores,
            "core_ms": round(self.core_ms, 3),
            "busy": round(self.busy, 3),
            "measured": self.measured,
            "floor_ms": round(self.floor_ms, 3),
            "traced_ms": round(self.traced_ms, 3),
        }
