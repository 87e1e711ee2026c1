"""Step time in which the trace shows no work of the step: kept apart from per-step overhead.

A step's time is the input wait, the model's ops (and devices), and the rest, which per-step
overhead (Python, Keras callbacks, dispatching the step) is made of and which a larger batch or
`steps_per_execution` pays less often. On a busy machine part of that rest is no overhead at all:
the step's threads were waiting for a core. Two signs of it are taken out of the rest here:

- gaps: the training thread waited inside its call of the train function while nothing of the
  step was recorded anywhere, for a millisecond or more (measured by diagnose/activity.py);
- stretched time: outside those calls the training thread runs the same Python and dispatch
  every step, in the same events (the tf.function's call, eager ops, the time between them), and
  the model runs the same ops. Each of these is compared across the steps: where one step's is
  far above the others' (beyond Tukey's far-out fence, Q3 + 3 IQR, and more than twice the
  median, by a millisecond or more), that step counts the median and the time above it is a stall too: the thread was
  descheduled there, or did work only in some steps (a callback every N steps), which a trace
  without Python events cannot tell apart. Neither is a cost paid every step. The input wait is
  never compared so: a wait far above the others' is a cause (a shuffle buffer refilling).

On a quiet machine neither shows (no such gap, no such step) and the figures are the rest as
before. What is taken out is reported as the step's stall, never given to a cause.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from step_doctor.diagnose import hosttrace
from step_doctor.diagnose.activity import STALL_GAP_US
from step_doctor.diagnose.wait_record import InputWait, Stall, Wait

FAR_OUT = 3.0  # Tukey's far-out fence: Q3 + 3 IQR
MIN_STEPS = 5  # quartiles of fewer steps say nothing about which one is far out
BETWEEN = ""  # the label of the caller's time in no event of its own below the step's


@dataclass(frozen=True)
class Split:
    """The stall, per step (µs) and on average (ms), in gaps and in stretched time; the steps stretched."""

    stall_us: tuple[float, ...]
    stall_ms: float
    gaps_ms: float
    pipeline_ms: float  # the part of the stall in which the input pipeline's threads ran
    stretched_steps: int
    stretched_ms: float
    compute_stretched_ms: float  # the part of the stall inside the model's ops

    def record(self) -> Stall:
        return Stall(self.gaps_ms, self.pipeline_ms, self.stretched_steps, self.stretched_ms)

    def compute_left(self, compute_ms: float) -> float:
        """The model's compute per step without the stall inside its ops."""
        return round(max(compute_ms - self.compute_stretched_ms, 0.0), 3)

    def overhead_left(self, overhead_ms: float) -> float:
        """Per-step overhead without the rest of the stall, which lay outside the model's ops."""
        return round(max(overhead_ms - (self.stall_ms - self.compute_stretched_ms), 0.0), 3)

    def input_share(self, step_ms: float, input_ms: float | None, share: float | None) -> float | None:
        """The input wait's share of the step without the stall no fix removes (working_step)."""
        step = working(step_ms, self.stall_ms, self.pipeline_ms)
        if step < step_ms and input_ms is not None and step > 0:
            return round(100 * input_ms / step, 1)
        return share


def split(step_us: list, wait_us: list, compute_us: list, gaps: tuple[list, list], caller: list[dict]) -> Split:
    """Per step (µs) and on average (ms): the stall, in gaps and in stretched time; the steps stretched.

    `gaps`: per step, the gaps (activity.py), and the part of them in which the input pipeline's threads ran.
    `caller`: per step, the training thread's time outside its calls by the innermost event it was in, and the
    part of it in which the pipeline's threads ran (caller_time). The model's ops are compared across steps the
    same way: the same ops run every step."""
    gap_us, shared_us = gaps
    dispatch = [0.0] * len(step_us)
    shared = [float(s) for s in shared_us]
    for label in set().union(*caller):
        spent = [c.get(label, (0.0, 0.0)) for c in caller]
        for i, extra in enumerate(far_out([t for t, _ in spent])):
            dispatch[i] += extra
            shared[i] += extra * spent[i][1] / spent[i][0] if extra else 0.0
    compute = far_out(compute_us)
    rest = [max(s - w - c - g, 0.0) for s, w, c, g in zip(step_us, wait_us, compute_us, gap_us)]
    dispatch = [min(d, r) for d, r in zip(dispatch, rest)]
    n = max(len(step_us), 1)
    stall = [float(g) + d + c for g, d, c in zip(gap_us, dispatch, compute)]
    return Split(
        stall_us=tuple(stall),
        stall_ms=round(sum(stall) / n / 1e3, 3),
        gaps_ms=round(float(sum(gap_us)) / n / 1e3, 3),
        pipeline_ms=round(min(sum(shared), sum(stall)) / n / 1e3, 3),
        stretched_steps=sum(1 for d, c in zip(dispatch, compute) if d + c > 0),
        stretched_ms=round((sum(dispatch) + sum(compute)) / n / 1e3, 3),
        compute_stretched_ms=round(sum(compute) / n / 1e3, 3),
    )


def far_out(times: list) -> list[float]:
    """Per step, the time above the median where the step is far out (see the module's docstring), else 0."""
    if len(times) < MIN_STEPS:
        return [0.0] * len(times)
    typical = statistics.median(times)
    q1, q3 = np.percentile(times, [25, 75])
    fence = max(q3 + FAR_OUT * (q3 - q1), 2 * typical, typical + STALL_GAP_US)  # a stall lasts a millisecond or more
    return [float(t) - typical if t > fence else 0.0 for t in times]


def working(step_ms: float, stall_ms: float, pipeline_ms: float) -> float:
    """A step of `step_ms` without the part of its stall in which the input pipeline's threads did not run."""
    return max(step_ms - max(stall_ms - pipeline_ms, 0.0), 0.0)


def working_step(wait: Wait) -> float:
    """The step without the part of its stall in which nothing of the process ran: the machine's other load is no
    property of the program, and no fix removes it. Shares and estimates are of this step. The part in which the
    input pipeline's threads ran stays: on a CPU-only host they held the cores the step waited for, which a fix
    of the pipeline gives back."""
    if not isinstance(wait, InputWait):
        return 0.0
    return working(wait.step_ms, wait.stall_ms, wait.stall.pipeline_ms)


def left_out(wait: Wait) -> float:
    """The part of the step's stall in which nothing of the process ran: left out of shares and estimates."""
    return max((wait.step_ms or 0.0) - working_step(wait), 0.0) if isinstance(wait, InputWait) else 0.0


def caller_time(trace: hosttrace.HostTrace, windows: list[tuple[float, float]], busy: list) -> list[dict]:
    """Per window, the time of the threads that made calls (hosttrace.EXECUTE) outside those calls, by the
    innermost event they were in (its name; BETWEEN below none but the step's own): (time, the part of it in which
    `busy`, the input pipeline's work as disjoint intervals in order, ran)."""
    found = [defaultdict(lambda: [0.0, 0.0]) for _ in windows]
    callers = {event.tid for event in trace.executions}
    starts, busy_ends = [lo for lo, _ in windows], [b for _, b in busy]
    for tid, line in trace.step_lines:
        if tid in callers:
            for a, b, label in _innermost(trace.space, line):
                i = max(bisect.bisect_right(starts, a) - 1, 0)
                while i < len(windows) and windows[i][0] < b:
                    x, y = max(a, windows[i][0]), min(b, windows[i][1])
                    if y > x:
                        spent = found[i][f"{tid}:{label}"]
                        spent[0] += y - x
                        k = bisect.bisect_right(busy_ends, x)
                        while k < len(busy) and busy[k][0] < y:
                            spent[1] += min(y, busy[k][1]) - max(x, busy[k][0])
                            k += 1
                    i += 1
    return [{label: tuple(spent) for label, spent in f.items()} for f in found]


def _innermost(space, line):
    """(start, end, name of the innermost open event) of one thread's time outside its calls, in order."""
    names = {i: line.plane.display_names.get(i) or name for i, name in line.plane.event_names.items()}
    events = []
    base_ps = line.timestamp_ns * 1000
    for block in space.events(line):
        timed = block.duration_ps > 0
        starts = (base_ps + block.offset_ps[timed]) / 1e6
        ends = starts + block.duration_ps[timed] / 1e6
        events += zip(starts.tolist(), ends.tolist(), (names.get(int(m), "") for m in block.metadata_id[timed]))
    events.sort(key=lambda e: (e[0], -e[1]))
    stack: list[tuple] = []
    at = -np.inf
    for start, end, name in [*events, (np.inf, np.inf, None)]:
        while stack and stack[-1][1] <= start:
            top = stack.pop()
            yield from _piece(at, top[1], top[2], stack + [top])
            at = max(at, top[1])
        if start < np.inf:
            yield from _piece(at, start, stack[-1][2] if stack else BETWEEN, stack)
            at = max(at, start)
            stack.append((start, end, name))


def _piece(a: float, b: float, label: str, open_events: list):
    """The piece [a, b) of the caller's time, unless it lies inside one of its calls."""
    if b > a and not any(e[2] == hosttrace.EXECUTE for e in open_events):
        yield a, b, label
