"""Where the training steps of a profile begin and end: from step markers, else inferred.

1. Step markers: `Trace("train", step_num=N, _r=1)` (train/measure/profiling.py) shows in the
   trace as events named "train N" with a `step_num` and a `group_id`.
2. Inferred from the stock Keras TensorBoard callback: it wraps each profiled batch in
   `Trace("Profiled batch", step_num=N)` without `_r=1`, so xprof sees no step, but the events
   still bracket the steps (openxla/xprof#578).
3. Inferred from the executions of the train function (`tf.profiler.experimental.start/stop`
   around `fit`, a custom loop): the tf.function called most (by total time) on the Python
   thread; step i runs from the start of execution i to the start of execution i + 1.

The first step is left out when there are three or more: the profiler started inside it,
and the input pipeline had filled its buffers before the capture began.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from step_doctor.diagnose.hosttrace import Event, HostTrace

MARKERS = "step markers"
PROFILED_BATCH = "Profiled batch events of the Keras TensorBoard callback"
EXECUTIONS = "executions of the train function"


@dataclass
class Steps:
    source: str  # MARKERS, PROFILED_BATCH or EXECUTIONS
    windows: list[tuple[float, float]]  # the steps analysed (microseconds)
    names: list[str]
    left_out: int  # steps seen but not analysed (the first)
    function: str | None = None  # the tf.function whose executions made the steps
    warm_up: list[tuple[float, float]] = field(default_factory=list)  # steps left out: XLA's warm-up (xla.py)

    @property
    def inferred(self) -> bool:
        return self.source != MARKERS


def _markers(trace: HostTrace) -> list[Event]:
    return [
        e
        for e in trace.events
        if "step_num" in e.args and "group_id" in e.args and e.name != "Profiled batch" and e.thread != "?"
    ]


def _executions(trace: HostTrace) -> tuple[str | None, list[Event]]:
    calls: dict[str, list[Event]] = {}
    for event in trace.events:
        if "tf_function_call" in event.args and event.thread == "python":
            calls.setdefault(event.name, []).append(event)
    repeated = {name: evs for name, evs in calls.items() if len(evs) >= 2}
    if not repeated:
        return None, []
    name = max(repeated, key=lambda n: sum(e.dur for e in repeated[n]))
    return name, sorted(repeated[name], key=lambda e: e.ts)


def find(trace: HostTrace) -> Steps | None:
    """The profile's steps, or None when it shows none (no markers, no Keras batches, no repeated function)."""
    for source, events in ((MARKERS, _markers(trace)), (PROFILED_BATCH, trace.named("Profiled batch"))):
        events = sorted(events, key=lambda e: e.ts)
        if len(events) >= 2:
            return _keep([(e.ts, e.end) for e in events], [e.name for e in events], source)
    function, runs = _executions(trace)
    if not runs:
        return None
    windows = [(a.ts, b.ts) for a, b in zip(runs, runs[1:])] + [(runs[-1].ts, runs[-1].end)]
    return _keep(windows, [f"{function} #{i}" for i in range(len(runs))], EXECUTIONS, function)


def _keep(windows, names, source, function=None) -> Steps:
    drop = 1 if len(windows) >= 3 else 0
    return Steps(source, windows[drop:], names[drop:], drop, function)
