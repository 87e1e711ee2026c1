"""The host trace of one profile, read from the XSpace file in place: events, threads, nesting.

The analysis reads host threads: step markers, the Keras callback's batches, train-function
calls, `IteratorGetNext`, the tf.data iterator events (their ids, parent ids and dataset
parameters) and the functions and ops that tf.data threads ran. `load` streams the host
planes line by line (diagnose/xspace.py) and makes one `Event` of each of those only;
everything else (the model's ops on other threads, CUDA launches, device kernels) is reduced
per step later, from the file, without per-event objects (diagnose/activity.py).

Events look as they do in xprof's trace conversion (`trace_viewer`), which this reader
replaced (it turned the whole profile into JSON, 50 bytes of memory per byte of profile):
display names, `long_name`, and what xprof's event grouping adds (group_id on step markers,
"train 3" as a marker's name, is_eager on TensorFlow ops), reproduced for the events the
analysis reads (tests/test_diagnose_scale.py compares them with xprof's conversion).
Times are microseconds from the start of the capture.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from step_doctor.diagnose import xspace
from step_doctor.diagnose.tf_names import XLA_COMPILES, XLA_RUNS

GET_NEXT = ("IteratorGetNextOp::DoCompute", "IteratorGetNextAsOptionalOp::DoCompute")
FUNCTION_CALL = "InstantiatedCapturedFunction::"
EXECUTOR = "ExecutorState::Process"
# The calling thread runs a tf.function (or an eager op) and waits inside this until it returns: while it does,
# the work of the call shows on other threads (the executor's ops), on the devices, or as an input wait.
EXECUTE = "KernelAndDeviceFunc::Run"
PROFILED_BATCH = "Profiled batch"
# The stats the analysis reads (input_wait.py, step_windows.py), and what the grouping below needs.
ARGS = {
    "id",
    "parent_id",
    "name",
    "parallelism",
    "buffer_limit",
    "batch_size",
    "buffer_size",
    "cycle_length",
    "autotune",
    "shapes",
    "types",
    "cpu_budget",
    "threadpool_size",
    "buffered_bytes_MB",
    "buffered_elements",
    "step_num",
    "iter_num",
    "element_size",  # GetNext: bytes of the batch, the same for batches of the same shape (xla.py counts shapes)
    "tf_function_call",
    "_r",
}
FOUND_BY_STATS = {"step_num", "_r", "tf_function_call"}  # events of any name that carry one of these are kept
# xprof skips its event grouping when a profile holds these (group_events.cc, CheckLoopOp)
LOOP_OPS = {"WhileOp-EvalCond", "WhileOp-StartBody", "ForOp", "ParallelForOp", "ForeverOp"}
IMPLICIT_ROOTS = {"FunctionRun", "SessionRun", "RunGraph", EXECUTOR}
TF_DATA_FUNCTION_RUNS = {
    "InstantiatedCapturedFunction::Run",
    "InstantiatedCapturedFunction::RunAsync",
    "InstantiatedCapturedFunction::RunInstantiated",
    "InstantiatedCapturedFunction::RunWithBorrowedArgs",
}
CUDA_LAUNCHES = re.compile(r"^(cu|cuda)(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)")

SKIP, KEEP, OP, LAUNCH, CALL, OTHER, XLA_RUN, XLA_COMPILE, JAX, PYTHON = range(10)  # what a host event's name says
# A JAX-made profile (jax.profiler; its /host:metadata plane names jax_version): what jax_steps.py reads besides
# the step markers. The Python tracer's frames ("$file.py:12 function") are many; only the longer ones are kept.
JAX_EVENTS = re.compile(
    r"^(PjitFunction\(.*\)|ThunkExecutor::Execute|DevicePut|backend_compile_and_load|lower_sharding_computation"
    r"|trace_to_jaxpr_dynamic)$"
)
PYTHON_FRAME_MIN_PS = 20_000_000  # 20 µs


class ProfileError(Exception):
    """The profile could not be read or converted; the message names the file and why."""


@dataclass(eq=False, slots=True)
class Event:
    name: str
    ts: float
    end: float
    thread: str  # the thread's name without its numeric suffix: "python", "tf_data_iterator_resource"
    tid: tuple[int, int]  # (plane, line) as the file numbers them
    args: dict
    parent: Event | None = None  # innermost kept event on the same thread that encloses this one
    op: bool = False  # a TensorFlow op run (xprof marks these is_eager)

    @property
    def dur(self) -> float:
        return self.end - self.ts

    def ancestors(self):
        node = self.parent
        while node is not None:
            yield node
            node = node.parent


@dataclass
class HostTrace:
    path: Path
    events: list[Event]  # complete events the analysis reads, sorted by start
    space: xspace.XSpaceFile  # the open file: activity.py streams what was not kept from it
    op_lines: list = field(default_factory=list)  # host lines (not tf.data's) that ran TensorFlow ops
    launch_lines: list = field(default_factory=list)  # host lines that launched CUDA kernels
    grouped: bool = True  # False when xprof would skip its grouping (loop ops): no op is then known as one
    host_events: int = 0  # every complete host event, kept or not
    # the same events by what the analysis looks for, each list in order of start (see `_index`)
    iterators: list[Event] = field(default_factory=list)
    get_next: list[Event] = field(default_factory=list)
    calls: list[Event] = field(default_factory=list)  # tf.data function calls, on tf.data threads
    executors: list[Event] = field(default_factory=list)
    data_ops: list[Event] = field(default_factory=list)  # TensorFlow ops on tf.data threads
    executions: list[Event] = field(default_factory=list)  # EXECUTE on threads outside tf.data (the callers')
    xla_runs: list[Event] = field(default_factory=list)  # XLA executing a compiled program (tf_names.XLA_RUNS)
    xla_compiles: list[Event] = field(default_factory=list)  # XLA compiling one (tf_names.XLA_COMPILES)
    # (plane, line) and line of every host line outside tf.data with a timed event: threads of the training step
    step_lines: list = field(default_factory=list)
    jax: bool = False  # made by jax.profiler (jax_steps.py reads it)
    start_ns: int | None = None  # when the capture began, in ns since the epoch (its Task Environment plane)
    jax_events: list[Event] = field(default_factory=list)  # JAX_EVENTS and the Python tracer's longer frames

    def named(self, *names: str) -> list[Event]:
        wanted = set(names)
        return [e for e in self.events if e.name in wanted]

    def close(self) -> None:
        self.space.close()

    @property
    def size_bytes(self) -> int:
        return self.space.size


def unreadable(xplanes: list[str], said: str) -> str:
    names = ", ".join(xplanes)
    sizes = []
    for name in xplanes:
        path = Path(name)
        sizes.append(f"{path.stat().st_size} bytes" if path.is_file() else "not a file")
    return (
        f"could not read the profile {names} ({', '.join(sizes)}): {said}. "
        "The file is truncated, damaged or not an XSpace profile (a capture stopped while writing, a partial "
        "copy, or another file saved under that name). Capture the profile again."
    )


_OP_NAME = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_./>-]*")
_OP_TYPE = re.compile(r"[A-Z_][a-zA-Z0-9_]*")
_JAX_TYPE = re.compile(r"[a-z_][a-z0-9_]*(\[.*\])?")


def is_tf_op(name: str) -> bool:
    """A TensorFlow op run, "scope/name:Type", as xprof's tf_op_utils parses it (not tf.data, not JAX)."""
    parts = name.split(":", 1)
    if len(parts) != 2 or parts[0] == "Iterator":
        return False
    if _OP_NAME.fullmatch(parts[0]) and _OP_TYPE.fullmatch(parts[1]):
        return True
    if parts[1]:
        return False
    op_type = parts[0].rsplit("/", 1)[-1]
    suffix = op_type.rsplit("_", 1)
    if len(suffix) == 2 and suffix[1].lstrip("-").isdigit():
        op_type = suffix[0]
    return not _JAX_TYPE.fullmatch(op_type)


def _kind(name: str, display: str, grouped: bool, jax: bool = False) -> int:
    shown = display or name
    if jax and (JAX_EVENTS.match(shown) or shown.startswith("$")):
        return PYTHON if shown.startswith("$") else JAX
    if shown.startswith("Iterator::") or shown in GET_NEXT or shown in (EXECUTOR, EXECUTE, PROFILED_BATCH):
        return KEEP
    if shown.startswith(FUNCTION_CALL):
        return CALL
    if XLA_RUNS.match(shown):
        return XLA_RUN
    if XLA_COMPILES.match(shown):
        return XLA_COMPILE
    if grouped and is_tf_op(name):
        return OP
    if CUDA_LAUNCHES.match(name):
        return LAUNCH
    if name.startswith("ThreadpoolListener::") or name.endswith(("Produce", "Consume")):
        return SKIP  # zero-length markers and tf.data's producer/consumer links: xprof's trace drops them
    return OTHER


class _PlaneKinds:
    """What each event name of one host plane is, looked up for a block's metadata ids at once."""

    def __init__(self, plane: xspace.Plane, grouped: bool, jax: bool = False):
        ids = sorted(plane.event_names)
        self.ids = np.asarray(ids, dtype=np.int64)
        self.kinds = np.asarray(
            [_kind(plane.event_names[i], plane.display_names.get(i, ""), grouped, jax) for i in ids] or [SKIP],
            dtype=np.int8,
        )
        by_name = {name: i for i, name in plane.stat_names.items()}
        # roots (`_r`) on tf.data's threads are its functions' runs: never a step, never near a marker
        self.patterns = {
            tf_data: _stat_pattern(by_name, FOUND_BY_STATS - ({"_r"} if tf_data else set()))
            for tf_data in (False, True)
        }

    def of(self, metadata_id: np.ndarray) -> np.ndarray:
        if len(self.ids) == 0:
            return np.zeros(len(metadata_id), dtype=np.int8)
        at = np.clip(np.searchsorted(self.ids, metadata_id), 0, len(self.ids) - 1)
        return np.where(self.ids[at] == metadata_id, self.kinds[at], SKIP)

    def with_stats(self, block: xspace.Block, tf_data: bool) -> np.ndarray:
        """Events whose bytes may hold one of FOUND_BY_STATS (checked when parsed)."""
        found = np.zeros(len(block.starts), dtype=bool)
        pattern = self.patterns[tf_data]
        if pattern is None:
            return found
        hits = np.fromiter((m.start() for m in pattern.finditer(block.data)), dtype=np.int64)
        if len(hits):
            found[np.searchsorted(block.starts, hits, side="right") - 1] = True
        return found


def _stat_pattern(stat_ids: dict[str, int], names: set[str]):
    """Bytes of an XStat of one of these stats inside an event: tag 0x22, a one-byte length, metadata id."""
    wanted = [stat_ids[n] for n in sorted(names) if n in stat_ids]
    if not wanted:
        return None
    alternatives = b"|".join(re.escape(xspace.encode_varint(i)) for i in wanted)
    return re.compile(rb"\x22[\x00-\x7f]\x08(?:" + alternatives + rb")", re.DOTALL)


def _format(value) -> str:
    """A stat as xprof's trace shows it: integers in decimal, floats with six significant digits."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def load(xplane: str | Path) -> HostTrace:
    """The events of one .xplane.pb that the analysis reads, with their threads and same-thread nesting."""
    xplane = Path(xplane)
    if not xplane.is_file():
        raise ProfileError(unreadable([str(xplane)], "it is a folder or special file, not a profile file"))
    try:
        space = xspace.XSpaceFile(xplane)
    except (xspace.XSpaceError, OSError) as error:
        raise ProfileError(unreadable([str(xplane)], str(error))) from None
    try:
        trace = _read_host(xplane, space)
    except xspace.XSpaceError as error:
        space.close()
        raise ProfileError(unreadable([str(xplane)], str(error))) from None
    except BaseException:
        space.close()
        raise
    if not trace.host_events:
        space.close()
        raise ProfileError(
            f"the profile {xplane} holds no host events ({xplane.stat().st_size} bytes): the capture recorded "
            "nothing, or it stopped before any step ran. Capture the profile again over a few training steps."
        )
    return trace


def host_planes(space: xspace.XSpaceFile) -> list[xspace.Plane]:
    return [p for p in space.planes if p.name.startswith("/host:") and p.lines]


def made_by_jax(space: xspace.XSpaceFile) -> bool:
    return any(p.name == "/host:metadata" and "jax_version" in p.stats for p in space.planes)


def start_ns(space: xspace.XSpaceFile) -> int | None:
    for plane in space.planes:
        if plane.name == "Task Environment" and plane.stats.get("profile_start_time"):
            return int(plane.stats["profile_start_time"])
    return None


def _read_host(path: Path, space: xspace.XSpaceFile) -> HostTrace:
    grouped = not any(LOOP_OPS.intersection(p.event_names.values()) for p in space.planes)
    trace = HostTrace(path, [], space, grouped=grouped, jax=made_by_jax(space), start_ns=start_ns(space))
    for plane in host_planes(space):
        kinds, names = _PlaneKinds(plane, grouped, trace.jax), _Names(plane)
        for number, line in enumerate(plane.lines):
            _read_line(trace, space, plane, kinds, names, number, line)
    trace.events.sort(key=lambda e: (e.ts, -e.end))
    _nest(trace.events)
    if grouped:
        _group(trace.events)
    _index(trace)
    return trace


def _index(trace: HostTrace) -> None:
    for event in trace.events:
        name = event.name
        if trace.jax and (name.startswith("$") or JAX_EVENTS.match(name)):
            trace.jax_events.append(event)
        elif name.startswith("Iterator::"):
            trace.iterators.append(event)
        elif name in GET_NEXT:
            trace.get_next.append(event)
        elif name == EXECUTOR:
            trace.executors.append(event)
        elif name == EXECUTE and not event.thread.startswith("tf_data"):
            trace.executions.append(event)
        elif event.thread.startswith("tf_data"):
            if name.startswith(FUNCTION_CALL):
                trace.calls.append(event)
            elif event.op:
                trace.data_ops.append(event)
        elif XLA_RUNS.match(name):
            trace.xla_runs.append(event)
        elif XLA_COMPILES.match(name):
            trace.xla_compiles.append(event)


def merge(trace: HostTrace, companion: HostTrace) -> None:
    """Another capture of the same process and window laid onto this trace's clock: TensorFlow's, beside JAX's
    (jax_capture.py). Each file counts microseconds from its own start; their starts say how far apart they are.
    The companion's threads stay threads of their own (its lines are not streamed again: activity.py reads this
    file's)."""
    shift = ((companion.start_ns or 0) - (trace.start_ns or 0)) / 1e3 if trace.start_ns and companion.start_ns else 0.0
    for event in companion.events:
        event.ts += shift
        event.end += shift
        event.tid = (event.tid[0] + 1000, event.tid[1])
    trace.events = sorted(trace.events + companion.events, key=lambda e: (e.ts, -e.end))
    trace.host_events += companion.host_events
    for name in (
        "iterators",
        "get_next",
        "calls",
        "executors",
        "executions",
        "data_ops",
        "xla_runs",
        "xla_compiles",
        "jax_events",
    ):
        setattr(trace, name, [])
    _index(trace)


class _Names:
    """A plane's event names as the trace shows them, its stats by name, and parsed stats by their bytes."""

    def __init__(self, plane: xspace.Plane):
        self.shown = {i: plane.display_names.get(i) or name for i, name in plane.event_names.items()}
        self.long = {i: name for i, name in plane.event_names.items() if plane.display_names.get(i)}
        self.stat_names = plane.stat_names
        self.wanted = {i for i, name in plane.stat_names.items() if name in ARGS}
        self.parsed: dict[tuple[int, bytes], dict] = {}  # iterator events repeat their stats byte for byte

    def args(self, metadata_id: int, raw: bytes) -> dict:
        """The event's args (shared by events with the same name and stats: never changed in place)."""
        found = self.parsed.get((metadata_id, raw))
        if found is None:
            found = {}
            if raw:
                for stat in xspace.parse_event(raw).stats:
                    if stat.metadata_id in self.wanted:
                        value = xspace.stat_value(stat, self.stat_names)
                        found[self.stat_names[stat.metadata_id]] = _format(value)
            if metadata_id in self.long:
                found["long_name"] = self.long[metadata_id]
            self.parsed[metadata_id, raw] = found
        return found


def _read_line(trace: HostTrace, space, plane, kinds: _PlaneKinds, names: _Names, number: int, line) -> None:
    thread = line.thread.split("/")[0] or "?"
    tf_data = thread.startswith("tf_data")
    tid = (plane.index, number)
    has_ops = has_launches = timed_any = False
    base_ps = line.timestamp_ns * 1000
    append = trace.events.append
    for block in space.events(line):
        kind = kinds.of(block.metadata_id)
        timed = block.duration_ps > 0
        trace.host_events += int(np.count_nonzero(timed))
        timed_any = timed_any or bool(timed.any())
        has_ops = has_ops or bool(np.any(((kind == OP) | (kind == XLA_RUN)) & timed))
        has_launches = has_launches or bool(np.any(kind == LAUNCH))
        # XLA's runs and compiles are few per step: kept, for the compile figures (xla.py)
        keep = timed & ((kind == KEEP) | (kind == CALL) | ((kind == OP) & tf_data) | (kind >= XLA_RUN))
        keep &= (kind != PYTHON) | (block.duration_ps >= PYTHON_FRAME_MIN_PS)
        others = timed & (kind == OTHER)
        if others.any():
            keep |= others & kinds.with_stats(block, tf_data)
        which = np.flatnonzero(keep)
        if not len(which):
            continue
        starts_ps = base_ps + block.offset_ps[which]
        starts = (starts_ps / 1e6).tolist()
        ends = ((starts_ps + block.duration_ps[which]) / 1e6).tolist()
        codes = kind[which].tolist()
        ids = block.metadata_id[which].tolist()
        shown = names.shown
        for ts, end, code, metadata_id, raw in zip(starts, ends, codes, ids, block.stats(which)):
            args = names.args(metadata_id, raw)
            if code == OTHER:
                if not args.keys() & FOUND_BY_STATS:
                    continue
                args = dict(args)  # markers and roots are renamed and grouped below: their own copy
            append(Event(shown.get(metadata_id, ""), ts, end, thread, tid, args, None, code == OP))
    if has_ops and not tf_data:
        trace.op_lines.append(line)
    if has_launches:
        trace.launch_lines.append(line)
    if timed_any and not tf_data:
        trace.step_lines.append((tid, line))


def _nest(events: list[Event]) -> None:
    """Set each event's parent: the innermost event on its thread that is open when it starts and encloses it."""
    stacks: dict[tuple[int, int], list[Event]] = {}
    for event in events:  # sorted by start, longer first on ties
        stack = stacks.setdefault(event.tid, [])
        while stack and stack[-1].end < event.end - 1e-3:
            stack.pop()
        event.parent = stack[-1] if stack else None
        stack.append(event)


def _group(events: list[Event]) -> None:
    """What xprof's event grouping (group_events.cc) gives the events read here: group ids, step names.

    Root events (`_r` > 0, not a tf.data function's run) each start a group that their same-thread
    descendants join; a root nested in another of the same level joins that one instead. Roots are
    numbered by level, then start. A user root is renamed after its group ("train 3"). When the
    profile holds a TensorFlow loop (an executor iterating a while loop, as steps_per_execution > 1
    runs), xprof groups by loop iteration instead, and no root of ours gets a group.
    """
    tf_data_steps, iterations, candidates = set(), defaultdict(set), []
    for event in events:
        args = event.args
        if not args:
            continue
        if event.name == EXECUTOR and "iter_num" in args:
            iterations[args.get("id")].add(args["iter_num"])
        elif event.name in TF_DATA_FUNCTION_RUNS:
            tf_data_steps.add(args.get("id"))
        if "_r" in args or "step_num" in args:
            candidates.append(event)
    if any(found != {"0"} for step, found in iterations.items() if step not in tf_data_steps):
        return
    roots = []
    for event in candidates:
        level = event.args.get("_r", "")
        if level.lstrip("-").isdigit() and int(level) > 0 and event.args.get("id") not in tf_data_steps:
            roots.append((-int(level), event.ts, event))
    roots.sort(key=lambda r: (r[0], r[1]))
    group_of: dict[int, int] = {}
    number = 0
    for _, _, root in roots:
        if id(root) in group_of:
            continue
        above = next((a for a in root.ancestors() if id(a) in group_of), None)
        if above is not None:
            group_of[id(root)] = group_of[id(above)]
            continue
        group_of[id(root)] = number
        if root.name not in IMPLICIT_ROOTS:
            step = root.args.get("iter_num") or root.args.get("step_num") or str(number)
            root.args["step_name"] = root.name = f"{root.name} {step}"
        number += 1
    for event in candidates:
        owner = next((a for a in (event, *event.ancestors()) if id(a) in group_of), None)
        if owner is not None:
            event.args["group_id"] = str(group_of[id(owner)])
