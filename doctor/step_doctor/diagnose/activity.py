"""What the model's ops and the devices did in each step, streamed from the profile file.

The second pass over a profile (the first, diagnose/hosttrace.py, kept the host events
the analysis reads as objects). Here everything else that counts as work is reduced per step
without one Python object per event: the TensorFlow ops that ran outside tf.data's threads,
the CUDA launch calls of the host threads, and every kernel and copy on the device planes.
Each source (a host line, a device stream) is read a block at a time; the blocks of all
sources are merged in time order, and each measure keeps only a running union and one number
per step. Memory stays at a few blocks whatever the size of the device planes.

Per step window:
- compute: the union of the model's ops (or the runs of its XLA executable: tf_names.XLA_RUNS) and all
  device activity that started in the step, outside the input waits (what input_wait.py calls compute,
  as before this reader);
- host compute: the same for the host ops alone;
- per device: busy (the union of its kernels inside the step, across streams: the time in
  which any kernel ran, what NVML calls utilization), kernels started, copy time by
  direction (host to device, device to host, device to device);
- launch: time the host spent in CUDA launch calls;
- stall: time in which the step's thread waited inside a call it made (hosttrace.EXECUTE: a tf.function's
  run) while nothing of the step was recorded anywhere: no event on the step's other threads (the executor
  running its ops), no device activity, no input wait. Only gaps of STALL_GAP_US or more count: a hand-off
  between threads takes microseconds; a gap of a millisecond is a thread waiting for a core (the process
  descheduled by other load, or its own input pipeline holding the cores) or for something the trace does not
  record; and of that, the part in which the input pipeline's threads ran (the cores they held).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator

import numpy as np

from step_doctor.diagnose import hosttrace, xspace
from step_doctor.diagnose.tf_names import XLA_RUNS
from step_doctor.diagnose.wait_record import DeviceFigures

HOST_OPS, LAUNCHES, WORK, WAITS = 0, 1, 2, 3  # WORK: any other event on a thread of the step but its caller's
STALL_GAP_US = 1000.0  # a gap in the step's recorded work this long is no hand-off between threads (see above)
MERGE_BYTES = 48 << 20  # read ahead over all sources together: memory does not grow with the streams' count
KERNEL, H2D, D2H, D2D, MEMSET = range(5)
_COPIES = (
    (re.compile(r"memcpy.?(h2d|htod)", re.I), H2D),
    (re.compile(r"memcpy.?(d2h|dtoh)", re.I), D2H),
    (re.compile(r"memcpy.?(d2d|dtod|p2p|other)", re.I), D2D),
    (re.compile(r"^memset", re.I), MEMSET),
)
# Lines xprof derives from the streams when it converts a profile; a raw capture has none, a saved
# conversion may: counting them would count each kernel twice.
DERIVED_LINES = {
    "Steps",
    "XLA Modules",
    "XLA Ops",
    "TensorFlow Ops",
    "TensorFlow Name Scope",
    "Framework Ops",
    "Framework Name Scope",
    "Source code",
    "XLA TraceMe",
    "Launch Stats",
    "CUPTI overhead",
}


def device_planes(space: xspace.XSpaceFile) -> list[xspace.Plane]:
    return [p for p in space.planes if p.name.startswith("/device:") and p.lines]


def _device_kind(name: str) -> int:
    for pattern, kind in _COPIES:
        if pattern.search(name):
            return kind
    return KERNEL


class _Union:
    """Measure of the union of intervals between consecutive `edges`, fed in order of start."""

    def __init__(self, edges: np.ndarray):
        self.edges = edges
        self.total = np.zeros(len(edges))  # measure of the union before each edge
        self.open: tuple[float, float] | None = None  # the merged interval still growing

    def feed(self, starts: np.ndarray, ends: np.ndarray) -> None:
        if not len(starts):
            return
        if self.open is not None:
            starts = np.concatenate(([self.open[0]], starts))
            ends = np.concatenate(([self.open[1]], ends))
        reach = np.maximum.accumulate(ends)
        new = np.flatnonzero(starts[1:] > reach[:-1]) + 1
        first = np.concatenate(([0], new))
        last = np.concatenate((new - 1, [len(starts) - 1]))
        seg_start, seg_end = starts[first], reach[last]
        self.open = (float(seg_start[-1]), float(seg_end[-1]))
        self._add(seg_start[:-1], seg_end[:-1])

    def _add(self, seg_start: np.ndarray, seg_end: np.ndarray) -> None:
        if not len(seg_start):
            return
        length = seg_end - seg_start
        before = np.concatenate(([0.0], np.cumsum(length)))
        at = np.searchsorted(seg_start, self.edges, side="right")
        inside = np.clip(self.edges - seg_start[np.maximum(at - 1, 0)], 0.0, length[np.maximum(at - 1, 0)])
        self.total += np.where(at > 0, before[np.maximum(at - 1, 0)] + inside, 0.0)

    def between(self) -> np.ndarray:
        """The measure between each pair of consecutive edges."""
        if self.open is not None:
            self._add(np.array([self.open[0]]), np.array([self.open[1]]))
            self.open = None
        return np.diff(self.total)


class _Unsorted(Exception):
    """A line whose events are not in time order (writers sort them; this one did not)."""

    def __init__(self, line):
        super().__init__(line)
        self.line = line


def _line_source(space, line, kind_table, tag_of_kind: np.ndarray, whole: bool, block_bytes: int):
    """(start µs, end µs, tag) of the events of one line that have a tag, a block at a time, by start.

    `whole`: read the line at once and sort it (a line found out of order on the first try).
    """
    ids, kinds = kind_table
    base_ps = line.timestamp_ns * 1000
    last = -np.inf
    parts = []
    for block in space.events(line, block_bytes):
        at = np.clip(np.searchsorted(ids, block.metadata_id), 0, max(len(ids) - 1, 0))
        kind = np.where(ids[at] == block.metadata_id, kinds[at], -1) if len(ids) else np.full(len(at), -1)
        tags = np.where(kind >= 0, tag_of_kind[np.maximum(kind, 0)], -1)
        keep = (tags >= 0) & (block.duration_ps > 0)
        if not keep.any():
            continue
        start_ps = base_ps + block.offset_ps[keep]
        batch = (start_ps / 1e6, (start_ps + block.duration_ps[keep]) / 1e6, tags[keep])
        del block  # only the batch stays while the other sources catch up
        if whole:
            parts.append(batch)
            continue
        if batch[0][0] < last or np.any(np.diff(batch[0]) < 0):
            raise _Unsorted(line)
        last = batch[0][-1]
        yield batch
    if whole and parts:
        starts, ends, tags = (np.concatenate(p) for p in zip(*parts))
        order = np.argsort(starts, kind="stable")
        yield starts[order], ends[order], tags[order]


def _merged(sources: list) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """All sources' intervals in order of start, a batch at a time (each source holds about one block)."""
    buffers: list = [None] * len(sources)
    live = []

    def pull(i) -> bool:
        batch = next(sources[i], None)
        if batch is None:
            return False
        buffers[i] = batch if buffers[i] is None else tuple(np.concatenate(p) for p in zip(buffers[i], batch))
        return True

    for i in range(len(sources)):
        if pull(i):
            live.append(i)
    while live:
        # everything that starts before the earliest "last start" among the sources still reading is final
        cut = min(buffers[i][0][-1] for i in live)
        yield from _take(buffers, cut)
        for i in [i for i in live if buffers[i][0].size == 0 or buffers[i][0][-1] <= cut]:
            if not pull(i):
                live.remove(i)
    yield from _take(buffers, np.inf)


def _take(buffers: list, cut: float):
    out = []
    for i, buffer in enumerate(buffers):
        if buffer is None or not len(buffer[0]):
            continue
        n = len(buffer[0]) if cut == np.inf else int(np.searchsorted(buffer[0], cut, side="left"))
        if n:
            out.append(tuple(p[:n] for p in buffer))
            buffers[i] = tuple(p[n:] for p in buffer)
    if out:
        starts, ends, tags = (np.concatenate(p) for p in zip(*out))
        order = np.argsort(starts, kind="stable")
        yield starts[order], ends[order], tags[order]


def _host_kinds(plane: xspace.Plane, grouped: bool) -> tuple[np.ndarray, np.ndarray]:
    ids = sorted(plane.event_names)
    kinds = []
    for i in ids:
        name = plane.event_names[i]
        if (grouped and hosttrace.is_tf_op(name)) or XLA_RUNS.match(plane.display_names.get(i) or name):
            kinds.append(HOST_OPS)  # a step compiled with XLA runs its ops inside the executable's run
        elif hosttrace.CUDA_LAUNCHES.match(name):
            kinds.append(LAUNCHES)
        else:
            kinds.append(WORK)
    return np.asarray(ids, dtype=np.int64), np.asarray(kinds, dtype=np.int64)


def _device_kinds(plane: xspace.Plane) -> tuple[np.ndarray, np.ndarray]:
    ids = sorted(plane.event_names)
    return np.asarray(ids, dtype=np.int64), np.asarray([_device_kind(plane.event_names[i]) for i in ids], np.int64)


def measure(trace: hosttrace.HostTrace, windows: list[tuple[float, float]], waits: list[tuple[float, float]]) -> dict:
    """Per-window figures (µs, or counts) of the host ops, launches and devices: see the module's docstring."""
    unsorted: set[int] = set()
    while True:
        try:
            return _measure(trace, windows, waits, unsorted)
        except _Unsorted as error:
            unsorted.add(id(error.line))


def device_figures(work: dict, n: int) -> DeviceFigures | None:
    """Per analysed step, averaged over the devices: kernel busy time, kernels, copies; host launch time."""
    devices = work["devices"]
    if not devices:
        return None

    def mean(key: str) -> float:
        return float(sum(d[key].sum() for d in devices)) / len(devices) / n

    return DeviceFigures(
        devices=tuple(d["name"] for d in devices),
        busy_ms=round(mean("busy_us") / 1e3, 3),
        kernels_per_step=round(mean("kernels"), 1),
        h2d_ms=round(mean("h2d_us") / 1e3, 3),
        d2h_ms=round(mean("d2h_us") / 1e3, 3),
        d2d_ms=round(mean("d2d_us") / 1e3, 3),
        launch_ms=round(float(work["launch_us"].sum()) / n / 1e3, 3),
    )


def _pieces(lo: np.ndarray, hi: np.ndarray, waits) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each input wait cut to the windows it overlaps: (window, start, end)."""
    owner, starts, ends = [], [], []
    for a, b in waits:
        for j in range(int(np.searchsorted(hi, a, side="right")), int(np.searchsorted(lo, b, side="left"))):
            owner.append(j)
            starts.append(max(a, lo[j]))
            ends.append(min(b, hi[j]))
    return np.asarray(owner, dtype=np.int64), np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)


def _measure(trace, windows, waits, unsorted: set[int]) -> dict:
    space = trace.space
    devices = device_planes(space)
    lo = np.array([w[0] for w in windows], dtype=float)
    hi = np.array([w[1] for w in windows], dtype=float)
    n = len(windows)
    owner, wait_lo, wait_hi = _pieces(lo, hi, waits)
    window_edges = np.unique(np.concatenate([lo, hi]))
    compute_edges = np.unique(np.concatenate([lo, hi, wait_lo, wait_hi]))
    unions = {HOST_OPS: _Union(compute_edges), LAUNCHES: _Union(window_edges)}
    compute = _Union(compute_edges)
    gaps = _Gaps(STALL_GAP_US)
    for d in range(len(devices)):
        for kind in (KERNEL, H2D, D2H, D2D):
            unions[8 + 8 * d + kind] = _Union(window_edges)
    kernels = np.zeros((len(devices), n), dtype=np.int64)

    for starts, ends, tags in _merged(_sources(trace, devices, unsorted) + [_wait_source(waits)]):
        gaps.feed(starts, ends)
        at = np.searchsorted(lo, starts, side="right") - 1
        inside = (at >= 0) & (starts < hi[np.maximum(at, 0)])
        clipped = np.minimum(ends, hi[np.maximum(at, 0)])
        counted = inside & (tags != LAUNCHES) & (tags != WORK) & (tags != WAITS)
        compute.feed(starts[counted], clipped[counted])
        order = np.argsort(tags, kind="stable")  # one group per tag, each still in order of start
        bounds = np.flatnonzero(np.diff(tags[order])) + 1
        for group in np.split(order, bounds):
            tag = int(tags[group[0]])
            if tag == HOST_OPS:
                group = group[inside[group]]
                unions[tag].feed(starts[group], clipped[group])
            elif tag in unions:
                unions[tag].feed(starts[group], ends[group])
            if tag >= 8 and (tag - 8) % 8 == KERNEL:
                mine = group[inside[group]]
                kernels[(tag - 8) // 8] += np.bincount(at[mine], minlength=n)[:n]

    def total(union: _Union, edges: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        cumulative = np.concatenate(([0.0], np.cumsum(union.between())))
        return cumulative[np.searchsorted(edges, b)] - cumulative[np.searchsorted(edges, a)]

    def outside_waits(union: _Union) -> np.ndarray:
        busy = total(union, compute_edges, lo, hi)
        np.subtract.at(busy, owner, total(union, compute_edges, wait_lo, wait_hi))
        return np.maximum(busy, 0.0)

    stall, stall_pipeline = gaps.stalls(_calls(trace), lo, hi, pipeline_work(trace))
    return {
        "compute_us": outside_waits(compute),
        "host_compute_us": outside_waits(unions[HOST_OPS]),
        "launch_us": total(unions[LAUNCHES], window_edges, lo, hi),
        "stall_us": stall,
        "stall_pipeline_us": stall_pipeline,
        "devices": [
            {
                "name": plane.name,
                "kernels": kernels[d],
                **{
                    key: total(unions[8 + 8 * d + kind], window_edges, lo, hi)
                    for key, kind in (("busy_us", KERNEL), ("h2d_us", H2D), ("d2h_us", D2H), ("d2d_us", D2D))
                },
            }
            for d, plane in enumerate(devices)
        ],
    }


class _Gaps:
    """The gaps of at least `least` µs in the union of intervals fed in order of start (from -inf to +inf)."""

    def __init__(self, least: float):
        self.least = least
        self.reach = -np.inf
        self.found: list[tuple[float, float]] = []

    def feed(self, starts: np.ndarray, ends: np.ndarray) -> None:
        if not len(starts):
            return
        before = np.maximum.accumulate(np.concatenate(([self.reach], ends)))  # the reach before each interval
        wide = np.flatnonzero(starts - before[:-1] >= self.least)
        self.found += zip(before[wide].tolist(), starts[wide].tolist())
        self.reach = float(before[-1])

    def stalls(self, calls: list, lo: np.ndarray, hi: np.ndarray, busy: list) -> tuple[np.ndarray, np.ndarray]:
        """Per window, the time of these gaps inside the calls, in pieces of at least `least` µs; and the part of it
        in which `busy` (disjoint intervals, in order) ran."""
        out, shared = np.zeros(len(lo)), np.zeros(len(lo))
        gaps = [*self.found, (self.reach, np.inf)]
        starts, busy_ends = [a for a, _ in calls], [b for _, b in busy]
        for a, b in gaps:
            i = max(bisect.bisect_right(starts, a) - 1, 0)
            while i < len(calls) and calls[i][0] < b:
                x, y = max(a, calls[i][0]), min(b, calls[i][1])
                for j in range(int(np.searchsorted(hi, x, side="right")), int(np.searchsorted(lo, y, side="left"))):
                    p, q = max(x, lo[j]), min(y, hi[j])
                    if q - p >= self.least:
                        out[j] += q - p
                        k = bisect.bisect_right(busy_ends, p)
                        while k < len(busy) and busy[k][0] < q:
                            shared[j] += min(q, busy[k][1]) - max(p, busy[k][0])
                            k += 1
                i += 1
        return out, shared


def _disjoint(intervals) -> list[tuple[float, float]]:
    """The union of intervals as disjoint ones, in order."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _calls(trace) -> list[tuple[float, float]]:
    """The calls the step's threads waited in (hosttrace.EXECUTE), merged where they overlap, in order."""
    return _disjoint((e.ts, e.end) for e in trace.executions)


def pipeline_work(trace) -> list[tuple[float, float]]:
    """When the input pipeline's threads ran its functions and ops, merged, in order."""
    ran = [(e.ts, e.end) for e in trace.executors if e.thread.startswith("tf_data")]
    return _disjoint(ran + [(e.ts, e.end) for e in trace.data_ops])


def _wait_source(waits):
    """The input waits as one more source of recorded work, in order of start."""
    if waits:
        starts, ends = (np.asarray(p, dtype=float) for p in zip(*sorted(waits)))
        yield starts, ends, np.full(len(starts), WAITS, dtype=np.int64)


def _sources(trace, devices, unsorted: set[int]) -> list:
    space = trace.space
    ops = {id(line) for line in trace.op_lines}
    launches = {id(line) for line in trace.launch_lines}
    callers = {event.tid for event in trace.executions}  # their own events wrap waits, not work (see STALL_GAP_US)
    work = {id(line) for tid, line in trace.step_lines if tid not in callers}
    lines = {id(line): line for line in trace.op_lines + trace.launch_lines}
    lines.update((id(line), line) for tid, line in trace.step_lines if id(line) in work)
    host = list(lines.values())
    streams = [(d, line) for d, plane in enumerate(devices) for line in plane.lines if line.thread not in DERIVED_LINES]
    # every source holds one block while the merge waits on the others: share a fixed budget between them
    block_bytes = int(np.clip(MERGE_BYTES // max(len(host) + len(streams), 1), 256 << 10, xspace.BLOCK_BYTES))
    tables = {}
    sources = []
    for line in host:
        wanted = np.array(
            [
                HOST_OPS if id(line) in ops else (WORK if id(line) in work else -1),
                LAUNCHES if id(line) in launches else (WORK if id(line) in work else -1),
                WORK if id(line) in work else -1,
            ]
        )
        if id(line.plane) not in tables:
            tables[id(line.plane)] = _host_kinds(line.plane, trace.grouped)
        table = tables[id(line.plane)]
        sources.append(_line_source(space, line, table, wanted, id(line) in unsorted, block_bytes))
    for d, line in streams:
        if id(line.plane) not in tables:
            tables[id(line.plane)] = _device_kinds(line.plane)
        tags = 8 + 8 * d + np.arange(5)
        sources.append(_line_source(space, line, tables[id(line.plane)], tags, id(line) in unsorted, block_bytes))
    return sources
