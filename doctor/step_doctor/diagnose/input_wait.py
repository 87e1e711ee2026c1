"""Which tf.data stage the training step waits for, and what that stage spends its time on.

Read from one profile's host trace (diagnose/hosttrace.py) and its steps
(diagnose/step_windows.py), after the tf.data bottleneck analysis TensorFlow's profiler
once shipped, rebuilt on what xprof 2.24 exposes and changed where that one misled:

- The consumer waits while `IteratorGetNextOp::DoCompute` runs inside a step: that is the
  input wait. Only time inside those wait windows is ever blamed, so blame adds up to the wait.
- The iterator tree: iterator events nest on one thread (a synchronous stage calls its input),
  and an asynchronous stage (Prefetch, ParallelMap, MapAndBatch, ParallelInterleave, ...) hands
  its input to other threads, whose iterator events carry the stage's id as `parent_id`.
  Walking down from each wait, a stage is charged the part of the wait that none of its inputs
  covers (its self time inside the window). An asynchronous stage is charged only for time its
  consumer really waited; where several producers ran at once they share the time.
- Pass-through stages (Root, Prefetch, Repeat, ...) do no work of their own: their self time is
  reported as unattributed, never as a cause.
- A shuffle call that pulled more than one element (the buffer filling at the start of an
  iterator) is charged to that shuffle as a fill, not to the stages it pulled from.
- A stage's function calls (map, filter, generator, interleave) are tied to it through their
  executor step ids, so its ops (Python, decode, augmentation, resize, file reads), its threads
  and how many calls ran at once are measured, not guessed from its name.
- Everything is averaged per analysed step and compared with the step time, never with an
  absolute threshold.
"""

from __future__ import annotations

import bisect
import functools
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from step_doctor.diagnose import activity, stalls, xla
from step_doctor.diagnose.hosttrace import EXECUTOR, FUNCTION_CALL, GET_NEXT, Event, HostTrace
from step_doctor.diagnose.step_windows import Steps
from step_doctor.diagnose.tf_names import (  # noqa: F401 (the causes read these from here)
    ASYNC,
    AUGMENT_OPS,
    DECODE_OPS,
    FUNCTION_STAGES,
    PASS_THROUGH,
    PYTHON_OPS,
    READERS,
    RESIZE_OPS,
    SHUFFLES,
    is_pass_through,
    kind_of,
    op_category,
)
from step_doctor.diagnose.wait_record import (
    InputWait,
    PrefetchStage,
    Stage,
    StageFunctions,
    StepFigures,
    Unmeasured,
    Wait,
)


def _op_type(event: Event) -> str:
    long_name = event.args.get("long_name")
    return str(long_name).rsplit(":", 1)[-1] if long_name and ":" in str(long_name) else event.name


def _path(event: Event) -> str:
    """The iterator's place in the tree, the same for every repetition and epoch: '[n]' indices removed."""
    return _without_indices(str(event.args.get("long_name") or event.name))


@functools.lru_cache(maxsize=4096)
def _without_indices(name: str) -> str:
    return re.sub(r"\[\d+\]", "", name)


def _union(intervals: list[tuple[float, float]]) -> float:
    total, start, end = 0.0, None, None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            if end is not None:
                total += end - start
            start, end = lo, hi
        else:
            end = max(end, hi)
    return total + (end - start if end is not None else 0.0)


def _clip_union(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    return _union([(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)])


@dataclass
class _Stage:
    path: str
    kind: str
    ops: set = field(default_factory=set)
    params: dict = field(default_factory=dict)
    threads: set = field(default_factory=set)
    ids: set = field(default_factory=set)
    calls: int = 0
    busy_us: float = 0.0
    blocking_us: float = 0.0
    fill_us: float = 0.0
    fills: int = 0
    pulled: int = 0
    fn_calls: int = 0
    fn_work: list = field(default_factory=list)  # (start, end) of function work inside the analysed range
    fn_threads: set = field(default_factory=set)
    op_us: Counter = field(default_factory=Counter)


class _Tree:
    """Iterator events of one trace, with same-thread children and producers by parent id."""

    def __init__(self, trace: HostTrace):
        self.iterators = trace.iterators
        self.path_of_id: dict[str, str] = {}
        self.kids: dict[int, list[Event]] = defaultdict(list)  # id(event) -> same-thread iterator children
        self.top: list[Event] = []  # iterator events with no iterator above them on their thread
        self.by_parent_id: dict[str, list[Event]] = defaultdict(list)
        for event in self.iterators:
            ident = event.args.get("id")
            if ident is not None:
                self.path_of_id.setdefault(str(ident), _path(event))
            above = next((a for a in event.ancestors() if a.name.startswith("Iterator::")), None)
            if above is None:
                self.top.append(event)
            else:
                self.kids[id(above)].append(event)
            parent_id = event.args.get("parent_id")
            if parent_id is not None:
                self.by_parent_id[str(parent_id)].append(event)
        self.longest: dict[str, float] = {}
        for parent_id, events in self.by_parent_id.items():
            events.sort(key=lambda e: e.ts)
            self.longest[parent_id] = max(e.dur for e in events)
        self.starts = {pid: [e.ts for e in events] for pid, events in self.by_parent_id.items()}

    def children(self, event: Event, lo: float, hi: float) -> list[Event]:
        found = [k for k in self.kids.get(id(event), ()) if k.ts < hi and k.end > lo]
        if kind_of(event.name) in ASYNC and event.args.get("id") is not None:
            ident = str(event.args["id"])
            events = self.by_parent_id.get(ident, [])
            if events:
                starts = self.starts[ident]
                i = bisect.bisect_left(starts, hi)
                earliest = lo - self.longest[ident]
                while i > 0 and starts[i - 1] >= earliest:
                    i -= 1
                    other = events[i]
                    if other.tid != event.tid and other.end > lo and other.ts < hi:
                        found.append(other)
        return found


def _split(segments, kids):
    """Self time of an event over its segments, and each child's share of the rest (shared where they overlap)."""
    own = 0.0
    shares: dict[int, list] = {id(k): [] for k in kids}
    for lo, hi, weight in segments:
        active = [k for k in kids if k.ts < hi and k.end > lo]
        if not active:
            own += (hi - lo) * weight
            continue
        cuts = sorted({lo, hi, *(max(lo, k.ts) for k in active), *(min(hi, k.end) for k in active)})
        for a, b in zip(cuts, cuts[1:]):
            if b <= a:
                continue
            cover = [k for k in active if k.ts <= a and k.end >= b]
            if not cover:
                own += (b - a) * weight
            else:
                for k in cover:
                    shares[id(k)].append((a, b, weight / len(cover)))
    return own, shares


def _waits(trace: HostTrace, windows) -> tuple[list[float], list[Event]]:
    """Per step, the time GetNext ran inside it, and those GetNext events."""
    get_next = trace.get_next
    starts = [e.ts for e in get_next]
    waits_per_step, wait_events = [], []
    for lo, hi in windows:
        i = bisect.bisect_left(starts, lo)
        inside = []
        while i < len(get_next) and get_next[i].ts < hi:
            if get_next[i].end <= hi + 1e-3:
                inside.append(get_next[i])
            i += 1
        waits_per_step.append(sum(e.dur for e in inside))
        wait_events.extend(inside)
    return waits_per_step, wait_events


def _stages(tree: _Tree, lo_all: float, hi_all: float) -> dict[str, _Stage]:
    """One record per stage of the iterator tree: its calls, busy time, threads, ids, ops and parameters."""
    stages: dict[str, _Stage] = {}
    for event in tree.iterators:
        path = _path(event)
        s = stages.get(path)
        if s is None:
            s = stages[path] = _Stage(path, kind_of(event.name))
        inside = min(event.end, hi_all) - max(event.ts, lo_all)
        if inside > 0:
            s.calls += 1
            s.busy_us += inside
            s.threads.add(event.tid)
        if event.args.get("id") is not None:
            s.ids.add(str(event.args["id"]))
        if event.args.get("name"):
            s.ops.add(str(event.args["name"]))
        for key in ("parallelism", "buffer_limit", "batch_size", "buffer_size", "cycle_length", "autotune"):
            if key in event.args:
                s.params[key] = event.args[key]
        for key in ("shapes", "types", "cpu_budget", "threadpool_size", "buffered_bytes_MB", "buffered_elements"):
            if key in event.args:
                s.params[key] = event.args[key]
    return stages


def analyze(trace: HostTrace, steps: Steps | None) -> Wait:
    """Input wait per step, the blocking stages and the facts behind them (per-step figures)."""
    if steps is None or not steps.windows:
        return Unmeasured("the profile shows no training steps")
    windows = steps.windows
    lo_all, hi_all = windows[0][0], windows[-1][1]
    waits_per_step, wait_events = _waits(trace, windows)
    step_us = [hi - lo for lo, hi in windows]
    tree = _Tree(trace)
    stages = _stages(tree, lo_all, hi_all)

    # Blame: walk down from every root inside every wait window.
    roots_of: dict[int, list[Event]] = defaultdict(list)
    for event in tree.top:
        holder = next((a for a in event.ancestors() if a.name in GET_NEXT), None)
        if holder is not None:
            roots_of[id(holder)].append(event)

    def walk(event: Event, segments, fill: _Stage | None, depth: int) -> None:
        segments = [
            (max(a, event.ts), min(b, event.end), w) for a, b, w in segments if min(b, event.end) > max(a, event.ts)
        ]
        if not segments or depth > 64:
            return
        s = stages[_path(event)]
        lo, hi = segments[0][0], segments[-1][1]
        kids = tree.children(event, lo, hi)
        if fill is None and s.kind in SHUFFLES and len(tree.kids.get(id(event), ())) >= 2:
            fill = s
            s.fills += 1
            s.pulled += len(tree.kids[id(event)])
        own, shares = _split(segments, kids)
        if fill is not None:
            fill.fill_us += own
        else:
            s.blocking_us += own
        for kid in kids:
            if shares[id(kid)]:
                walk(kid, shares[id(kid)], fill, depth + 1)

    for holder in wait_events:
        for root in roots_of.get(id(holder), ()):
            walk(root, [(holder.ts, holder.end, 1.0)], None, 0)

    _functions(trace, tree, stages, lo_all, hi_all)
    work = activity.measure(trace, windows, sorted((e.ts, e.end) for e in wait_events))
    caller = stalls.caller_time(trace, windows, activity.pipeline_work(trace))
    gaps = (work["stall_us"].tolist(), work["stall_pipeline_us"].tolist())
    split = stalls.split(step_us, waits_per_step, work["compute_us"].tolist(), gaps, caller)
    return _record(
        trace, steps, stages, waits_per_step, wait_events, work, split, _replicas(windows, wait_events, roots_of)
    )


def _replicas(windows, wait_events: list[Event], roots_of: dict) -> int:
    """How many input iterators a step reads from: one per replica under a distribution strategy (each replica's
    GetNext reads its own), one where several steps run per call (steps_per_execution: the same iterator again)."""
    starts = [lo for lo, _ in windows]
    read: dict[int, set] = defaultdict(set)
    for holder in wait_events:
        window = bisect.bisect_right(starts, holder.ts) - 1
        read[window].update(str(r.args["id"]) for r in roots_of.get(id(holder), ()) if r.args.get("id") is not None)
    counts = [len(ids) for ids in read.values() if ids]
    return max(int(statistics.median_low(counts)), 1) if counts else 1


def _functions(trace: HostTrace, tree: _Tree, stages: dict, lo_all: float, hi_all: float) -> None:
    """Tie each tf.data function call to its stage; measure its work, threads and ops."""
    last_input: dict[tuple, list[Event]] = defaultdict(list)  # thread -> its iterator events by end
    for event in tree.iterators:
        last_input[event.tid].append(event)
    ends = {}
    for tid, events in last_input.items():
        events.sort(key=lambda e: e.end)
        ends[tid] = [e.end for e in events]
    owner_of_call: dict[str, _Stage] = {}
    calls = trace.calls
    for call in calls:
        enclosing = next((a for a in call.ancestors() if a.name.startswith("Iterator::")), None)
        if enclosing is not None:
            path = _path(enclosing)
        else:  # a parallel stage's runner: it fetched an input element, then called the function on it
            i = bisect.bisect_right(ends.get(call.tid, []), call.ts + 1e-3)
            if i == 0:
                continue
            fetched = last_input[call.tid][i - 1]
            path = tree.path_of_id.get(str(fetched.args.get("parent_id")))
            if path is None:
                continue
        s = stages.get(path)
        if s is None or call.args.get("id") is None:
            continue
        owner_of_call[str(call.args["id"])] = s
        if call.end > lo_all and call.ts < hi_all:
            s.fn_calls += 1
    executors: dict[str, list[Event]] = defaultdict(list)
    for event in trace.executors:
        if str(event.args.get("id")) in owner_of_call:
            executors[str(event.args["id"])].append(event)
    for call in calls:
        s = owner_of_call.get(str(call.args.get("id")))
        if s is None:
            continue
        work = executors.get(str(call.args["id"])) or [call]
        for piece in work:
            lo, hi = max(piece.ts, lo_all), min(piece.end, hi_all)
            if hi > lo:
                s.fn_work.append((lo, hi))
                s.fn_threads.add(piece.tid)
    for event in trace.data_ops:
        lo, hi = max(event.ts, lo_all), min(event.end, hi_all)
        if hi <= lo:
            continue
        owner = None
        for above in event.ancestors():
            if above.op:
                owner = None  # an op inside an op: counted with the outer one
                break
            if above.name == EXECUTOR or above.name.startswith(FUNCTION_CALL):
                owner = owner_of_call.get(str(above.args.get("id")))
                break
        if owner is not None:
            owner.op_us[_op_type(event)] += hi - lo


def _user_ops(ops: set) -> list[str]:
    """'fused(MapDataset:7,BatchDatasetV2:8)' -> ['MapDataset', 'BatchDatasetV2']; injected ones as 'inject/...'."""
    found = []
    for op in sorted(ops):
        if op.startswith("inject/"):
            found.append("injected")
            continue
        for part in re.findall(r"([A-Za-z]\w*Dataset\w*):\d+", op):
            found.append(part)
    return sorted(set(found))


def _functions_row(s: _Stage, n: int) -> StageFunctions | None:
    """What the stage's function calls did per step: CPU, wall, calls at a time, threads, ops."""
    if not (s.fn_calls or s.fn_work):
        return None
    work = _union(s.fn_work) if s.fn_work else 0.0
    summed = sum(b - a for a, b in s.fn_work)
    categories = Counter()
    for op_type, us in s.op_us.items():
        categories[op_category(op_type)] += us
    return StageFunctions(
        calls_per_step=round(s.fn_calls / n, 1),
        work_ms=round(summed / n / 1e3, 3),
        wall_ms=round(work / n / 1e3, 3),
        concurrency=round(summed / work, 2) if work else None,
        threads=len(s.fn_threads),
        ops_ms={k: round(v / n / 1e3, 3) for k, v in categories.most_common()},
        top_ops=tuple((k, round(v / n / 1e3, 3)) for k, v in s.op_us.most_common(5)),
    )


def _stage_row(s: _Stage, n: int, total_step: float) -> Stage:
    element_mb = None
    try:
        if float(s.params.get("buffered_elements", 0)) > 0:
            element_mb = float(s.params["buffered_bytes_MB"]) / float(s.params["buffered_elements"])
    except (TypeError, ValueError, KeyError):
        element_mb = None
    return Stage(
        path=s.path,
        kind=s.kind,
        ops=tuple(sorted(s.ops)),
        user_ops=tuple(_user_ops(s.ops)),
        injected=any(op.startswith("inject/") for op in s.ops),
        params={k: v for k, v in s.params.items() if k not in ("buffered_bytes_MB", "buffered_elements")},
        asynchronous=s.kind in ASYNC,
        pass_through=is_pass_through(s.kind),
        threads=len(s.threads),
        instances=len(s.ids),
        calls_per_step=round(s.calls / n, 1),
        busy_ms=round(s.busy_us / n / 1e3, 3),
        blocking_ms=round(s.blocking_us / n / 1e3, 3),
        blocking_percent=round(100 * s.blocking_us / total_step, 1),
        fill_ms=round(s.fill_us / n / 1e3, 3),
        fills=s.fills,
        pulled_per_fill=round(s.pulled / s.fills, 1) if s.fills else 0,
        element_mb=round(element_mb, 3) if element_mb is not None else None,
        functions=_functions_row(s, n),
    )


def _settings(stages: dict[str, _Stage], rows: tuple[Stage, ...]) -> tuple[int | None, bool | None, int | None]:
    """tf.data's cores (cpu_budget), whether autotune is on, and the batch size nearest the consumer."""
    budget = None
    for s in stages.values():
        for key in ("cpu_budget", "threadpool_size"):
            if budget is None and str(s.params.get(key, "")).isdigit():
                budget = int(s.params[key])
    roots = [s for s in stages.values() if s.kind == "Root"]
    batch = next((int(r.params["batch_size"]) for r in rows if str(r.params.get("batch_size", "")).isdigit()), None)
    return budget, any("cpu_budget" in s.params for s in roots) if roots else None, batch


def _record(trace, steps: Steps, stages, waits_per_step, wait_events, work, split: stalls.Split, replicas) -> InputWait:
    """The record, built once: the steps' figures, XLA's compile time and the stall taken out of the rest of the
    step (xla.py, stalls.py), in the order (and with the rounding) each was measured."""
    step_us = [hi - lo for lo, hi in steps.windows]
    n, total_step = len(step_us), sum(step_us)
    measured = bool(wait_events)
    rows = tuple(_stage_row(stages[path], n, total_step) for path in sorted(stages, key=lambda p: (p.count("::"), p)))
    budget, autotune, batch = _settings(stages, rows)
    wait_ms = total_step and sum(waits_per_step) / n / 1e3
    compute_ms = sum(work["compute_us"].tolist()) / n / 1e3
    step_ms, input_ms = round(total_step / n / 1e3, 3), round(wait_ms, 3) if measured else None
    figures = xla.measure(trace, steps, round(compute_ms, 3), step_ms)
    overhead_ms = round(max(total_step / n / 1e3 - (wait_ms or 0.0) - compute_ms, 0.0), 3)
    getnext_per_step = round(len(wait_events) / n, 2)
    per_window = getnext_per_step / replicas  # steps_per_execution: the steps of one call read the same iterator
    floor_ms = min((e.dur for e in wait_events), default=0.0) / 1e3
    return InputWait(
        measured=measured,
        reason=None if measured else "no tf.data GetNext ran inside the steps: the input came from outside tf.data",
        step_source=steps.source,
        inferred=steps.inferred,
        function=steps.function,
        steps=n,
        steps_left_out=steps.left_out,
        step_ms=step_ms,
        input_ms=input_ms,
        input_percent=split.input_share(
            step_ms, input_ms, round(100 * sum(waits_per_step) / total_step, 1) if measured and total_step else None
        ),
        getnext_per_step=getnext_per_step,
        getnext_floor_ms=round(floor_ms, 3) if measured else None,
        compute_ms=split.compute_left(round(compute_ms, 3)),
        overhead_ms=split.overhead_left(xla.overhead_left(overhead_ms, figures)),
        per_step=tuple(
            StepFigures(name, round(s / 1e3, 3), round(w / 1e3, 3), compile_ms, round(stall / 1e3, 3))
            for name, s, w, compile_ms, stall in zip(
                steps.names, step_us, waits_per_step, figures.per_step_ms, split.stall_us
            )
        ),
        cpu_budget=budget,
        autotune=autotune,
        batch_size=batch,
        prefetch=tuple(
            PrefetchStage(r.path, r.injected, r.params.get("buffer_limit")) for r in rows if r.kind == "Prefetch"
        ),
        unattributed_ms=round(sum(s.blocking_us for s in stages.values() if is_pass_through(s.kind)) / n / 1e3, 3),
        stages=rows,
        xla=figures,
        compile_ms=figures.compile_ms,
        stall_ms=split.stall_ms,
        stall=split.record(),
        replicas=replicas,
        steps_per_window=round(per_window) if per_window >= 1.5 else 1,
        host_compute_ms=round(float(work["host_compute_us"].sum()) / n / 1e3, 3),
        device=activity.device_figures(work, n),
    )
