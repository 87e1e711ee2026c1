"""A JAX-made profile (jax.profiler: Keras 3 on the JAX backend, a plain JAX or Flax loop): its steps and their parts.

JAX runs a jitted step asynchronously: the Python thread dispatches it (`PjitFunction(name)`) and goes on, while XLA
runs it on its own threads (`ThunkExecutor::Execute`, on a CPU) or on the device (its plane's kernels, on a GPU). So
what the device waits for is not the Python thread's fetching as such, but the part of it during which nothing of
the model ran. Per step:

- steps: from JAX's step markers (`jax.profiler.StepTraceAnnotation`; a step from one marker's start to the next's,
  since Keras's JAX trainer fetches its batch around its callbacks), else inferred from the executions of the
  jitted step: the most called `PjitFunction` on the Python thread (by total time), each from one call to the next;
- the model's work: XLA's runs on the host, or the device's kernels (activity.py), as one union;
- fetching batches: tf.data's `GetNext` (where TensorFlow's profiler ran beside JAX's: jax_capture.py), else the
  Python tracer's frames that fetch one (`next()`, a PyDataset's `__getitem__`, a generator): their time outside the
  model's work is the input wait, and the longest frame of the user's own code under them is named with its line;
- compiling: JAX's tracing, lowering and compiling a jitted function for a new shape (`backend_compile_and_load`
  once per compile);
- the rest (dispatching, callbacks, Python between the steps) is overhead.

The causes these make are in jax_causes.py.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict

from step_doctor.diagnose import activity, input_wait
from step_doctor.diagnose.hosttrace import Event, HostTrace
from step_doctor.diagnose.step_windows import EXECUTIONS, MARKERS, Steps
from step_doctor.diagnose.wait_record import (
    InputWait,
    JaxFigures,
    PythonInput,
    Stall,
    StepFigures,
    Unmeasured,
    Wait,
    XlaFigures,
)

DISPATCH = re.compile(r"^PjitFunction\((.*)\)$")
RUN = "ThunkExecutor::Execute"
COMPILING = {"backend_compile_and_load", "lower_sharding_computation", "trace_to_jaxpr_dynamic"}
COMPILE_ONCE = "backend_compile_and_load"
FRAME = re.compile(r"^\$(?:(?P<file>[^:]+):(?P<line>\d+) )?(?P<function>.*)$")
# Frames that fetch a batch: Python's next() (a generator, an iterator), a data adapter's, a PyDataset's item
FETCHES = re.compile(r"^\$(builtins next|.*\b(__next__|get_jax_iterator|__getitem__))$")
# Frames are named by their file's basename only, so the user's own frame is found by where the time goes: down the
# heaviest path from the fetch, never into what does the work for it (Python's builtins, NumPy's and TensorFlow's
# internals: LEAF_FILES), the last frame reached that is not a data adapter's (ADAPTER_FILES) is the one named.
LEAF_FILES = re.compile(
    r"^(builtins|<.*>|_methods|fromnumeric|numeric|function_base|shape_base|_ufunc_config|traceback_utils|dispatch"
    r"|gen_\w+|\w+_ops(_impl)?|ops|context|execute|constant_op|tensor_conversion\w*|tensor|resource_variable_ops"
    r"|variables|copyreg|abc|functools|typing)(\.py)?$"
)
ADAPTER_FILES = re.compile(
    r"^(\w*_adapter(_utils)?|epoch_iterator|trainer|iterator_ops|dataset_ops|threading|queue|tempfile)\.py$"
)


def _python(trace: HostTrace) -> tuple | None:
    """The Python thread's id: where the jitted steps are dispatched."""
    found: dict[tuple, float] = defaultdict(float)
    for event in trace.jax_events:
        if DISPATCH.match(event.name):
            found[event.tid] += event.dur
    return max(found, key=found.get) if found else None


def _outermost(events: list[Event]) -> list[Event]:
    """The events that no other of the list encloses (same thread), in order."""
    ids = {id(e) for e in events}
    return [e for e in events if not any(id(a) in ids for a in e.ancestors())]


def find(trace: HostTrace) -> Steps | None:
    """The steps of a JAX-made profile: JAX's step markers, else the jitted step's executions."""
    markers = sorted(
        (e for e in trace.events if "step_num" in e.args and e.args.get("_r") and e.tid[0] < 1000),
        key=lambda e: e.ts,
    )
    if len(markers) >= 2:
        windows = [(a.ts, b.ts) for a, b in zip(markers, markers[1:])] + [(markers[-1].ts, markers[-1].end)]
        return _keep(windows, [e.name for e in markers], MARKERS)
    python = _python(trace)
    runs: dict[str, list[Event]] = defaultdict(list)
    for event in _outermost([e for e in trace.jax_events if DISPATCH.match(e.name) and e.tid == python]):
        if not any(FETCHES.match(a.name) for a in event.ancestors()):  # not an op that builds a batch on the device
            runs[DISPATCH.match(event.name).group(1)].append(event)
    repeated = {name: evs for name, evs in runs.items() if len(evs) >= 2}
    if not repeated:
        return None
    name = max(repeated, key=lambda n: sum(e.dur for e in repeated[n]))
    calls = repeated[name]
    windows = [(a.ts, b.ts) for a, b in zip(calls, calls[1:])] + [(calls[-1].ts, calls[-1].end)]
    return _keep(windows, [f"{name} #{i}" for i in range(len(calls))], EXECUTIONS, f"PjitFunction({name})")


def _keep(windows, names, source, function=None) -> Steps:
    drop = 1 if len(windows) >= 3 else 0
    return Steps(source, windows[drop:], names[drop:], drop, function)


def _disjoint(intervals) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _inside(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _overlap(first: list, second: list) -> float:
    """The measure of the intersection of two lists of disjoint intervals in order."""
    total, j = 0.0, 0
    for a, b in first:
        while j < len(second) and second[j][1] <= a:
            j += 1
        k = j
        while k < len(second) and second[k][0] < b:
            total += min(b, second[k][1]) - max(a, second[k][0])
            k += 1
    return total


def _fetches(trace: HostTrace, python) -> tuple[list[Event], bool]:
    """The calls that fetched a batch: tf.data's GetNext where TensorFlow's profiler ran beside JAX's, else the Python
    frames that fetch one, on the Python thread."""
    get_next = [e for e in trace.get_next if e.thread == "python"]
    if get_next:
        return _outermost(get_next), True
    frames = [e for e in trace.jax_events if e.tid == python and FETCHES.match(e.name)]
    return _outermost(frames), False


def _file(frame: Event) -> str:
    match = FRAME.match(frame.name)
    return (match.group("file") or match.group("function")) if match else frame.name


def _user_frame(fetch: Event, children: dict[int, list[Event]]) -> str | None:
    """The user's own frame under a fetch, the line to name: down the heaviest path (see LEAF_FILES), the calls of one
    frame taken together (a batch calls its map once per element)."""
    frames, found = [fetch], None
    while True:
        total = sum(f.dur for f in frames)
        groups: dict[str, list[Event]] = defaultdict(list)
        for frame in frames:
            for child in children.get(id(frame), ()):
                if not LEAF_FILES.match(_file(child)):
                    groups[child.name].append(child)
        name = max(groups, key=lambda n: sum(c.dur for c in groups[n]), default=None)
        if name is None or sum(c.dur for c in groups[name]) < 0.3 * total:
            return found
        frames = groups[name]
        if FRAME.match(name).group("file") and not ADAPTER_FILES.match(_file(frames[0])):
            found = name


def _python_input(trace: HostTrace, fetches: list[Event], waited: dict[int, float], n: int) -> tuple:
    children: dict[int, list[Event]] = defaultdict(list)
    for event in trace.jax_events:
        if event.name.startswith("$") and event.parent is not None:
            children[id(event.parent)].append(event)
    by_frame: dict[str, float] = defaultdict(float)
    for fetch in fetches:
        by_frame[_user_frame(fetch, children) or fetch.name] += waited.get(id(fetch), 0.0)
    total = sum(by_frame.values()) or 1.0
    found = []
    for name, us in sorted(by_frame.items(), key=lambda item: -item[1]):
        if us < 0.01 * total:
            break
        match = FRAME.match(name)
        file = match.group("file") if match else None
        found.append(
            PythonInput(
                frame=name.lstrip("$"),
                file=file,
                line=int(match.group("line")) if match and match.group("line") else None,
                function=match.group("function") if match else name,
                ms=round(us / n / 1e3, 3),
                share=round(us / total, 3),
            )
        )
    return tuple(found[:5])


def _compiles(trace: HostTrace, python, windows) -> tuple[list[float], list[int]]:
    spans = _disjoint((e.ts, e.end) for e in trace.jax_events if e.tid == python and e.name in COMPILING)
    once = sorted(e.ts for e in trace.jax_events if e.name == COMPILE_ONCE)
    per_window = [_length(_inside(spans, lo, hi)) for lo, hi in windows]
    counts = [sum(1 for t in once if lo <= t < hi) for lo, hi in windows]
    return per_window, counts


def analyze(trace: HostTrace, steps: Steps | None) -> Wait:
    """The steps of a JAX-made profile and their parts (see the module's docstring)."""
    if steps is None or not steps.windows:
        return Unmeasured("the profile shows no training steps")
    windows, n = steps.windows, len(steps.windows)
    python = _python(trace)
    fetches, tf_data = _fetches(trace, python)
    fetches = [e for e in fetches if windows[0][0] <= e.ts < windows[-1][1]]
    host_runs = _disjoint((e.ts, e.end) for e in trace.jax_events if e.name == RUN)
    work = activity.measure(trace, windows, [])
    compile_us, compiles = _compiles(trace, python, windows)
    figures, per_step = _per_step(trace, steps, fetches, host_runs, work, compile_us)
    waited = {id(f): max(f.dur - _overlap([(f.ts, f.end)], host_runs), 0.0) for f in fetches}

    def mean_ms(key: str) -> float:
        return round(statistics.fmean(figures[key]) / 1e3, 3)

    jax = JaxFigures(
        function=steps.function or _dispatched(trace, python),
        tf_data=tf_data,
        fetch_ms=mean_ms("fetch"),
        overlapped_ms=mean_ms("overlapped"),
        dispatch_ms=mean_ms("dispatch"),
        h2d_ms=mean_ms("h2d"),
        python_input=() if tf_data else _python_input(trace, fetches, waited, n),
    )
    device = activity.device_figures(work, n)
    step_ms, input_ms = mean_ms("step"), mean_ms("input")
    return _record(
        input_wait.analyze(trace, steps) if tf_data else None,
        measured=True,
        reason=None,
        step_source=steps.source,
        inferred=steps.inferred,
        function=jax.function,
        steps=n,
        steps_left_out=steps.left_out,
        step_ms=step_ms,
        input_ms=input_ms,
        input_percent=round(100 * input_ms / step_ms, 1) if step_ms else 0.0,
        getnext_per_step=round(len(fetches) / n, 2),
        compute_ms=mean_ms("model"),
        overhead_ms=mean_ms("overhead"),
        per_step=tuple(per_step),
        xla=_xla(compile_us, compiles, n),
        compile_ms=mean_ms("compile"),
        stall_ms=0.0,
        stall=Stall(0.0, 0.0, 0, 0.0),
        replicas=1,
        steps_per_window=1,
        host_compute_ms=0.0 if device else mean_ms("model"),
        device=device,
        jax=jax,
    )


def _record(tf_data: Wait | None, **figures) -> InputWait:
    """The record, with tf.data's stages and what it knows of the pipeline where tf.data fed the steps."""
    stages = tf_data if isinstance(tf_data, InputWait) else None
    return InputWait(
        getnext_floor_ms=stages.getnext_floor_ms if stages else None,
        cpu_budget=stages.cpu_budget if stages else None,
        autotune=stages.autotune if stages else None,
        batch_size=stages.batch_size if stages else None,
        prefetch=stages.prefetch if stages else (),
        unattributed_ms=stages.unattributed_ms if stages else 0.0,
        stages=stages.stages if stages else (),
        **figures,
    )


def _per_step(trace, steps: Steps, fetches, host_runs, work, compile_us) -> tuple[dict, list[StepFigures]]:
    """Per step (µs): the fetches, the model's work and their overlap, the wait, compiling, dispatch, copies."""
    fetched = _disjoint((e.ts, e.end) for e in fetches)
    # on a device, its kernels are the model's work: the part of it during the fetches, from a second pass
    outside = activity.measure(trace, steps.windows, fetched)["compute_us"] if work["devices"] else None
    dispatch = _disjoint((e.ts, e.end) for e in _outermost([e for e in trace.jax_events if DISPATCH.match(e.name)]))
    puts = _disjoint((e.ts, e.end) for e in trace.jax_events if e.name == "DevicePut")
    figures, per_step = defaultdict(list), []
    for index, (lo, hi) in enumerate(steps.windows):
        step, fetch = hi - lo, _inside(fetched, lo, hi)
        if outside is not None:
            model = float(work["compute_us"][index])
            overlapped = max(model - float(outside[index]), 0.0)
        else:
            runs = _inside(host_runs, lo, hi)
            model, overlapped = _length(runs), _overlap(fetch, runs)
        wait = max(_length(fetch) - overlapped, 0.0)
        compile_ = min(compile_us[index], step)
        for key, value in (
            ("step", step),
            ("input", wait),
            ("model", model),
            ("compile", compile_),
            ("overhead", max(step - wait - model - compile_, 0.0)),
            ("fetch", _length(fetch)),
            ("overlapped", overlapped),
            ("dispatch", _length(_inside(dispatch, lo, hi))),
            ("h2d", _length(_inside(puts, lo, hi))),
        ):
            figures[key].append(value)
        per_step.append(
            StepFigures(steps.names[index], round(step / 1e3, 3), round(wait / 1e3, 3), round(compile_ / 1e3, 3), 0.0)
        )
    return figures, per_step


def _dispatched(trace: HostTrace, python) -> str | None:
    calls = defaultdict(float)
    for event in trace.jax_events:
        if event.tid == python and DISPATCH.match(event.name):
            calls[event.name] += event.dur
    return max(calls, key=calls.get) if calls else None


def _xla(compile_us: list[float], compiles: list[int], n: int) -> XlaFigures:
    """JAX compiling in the steps, as the XLA record the causes read (a jitted step always runs through XLA)."""
    total, steps_compiling = sum(compiles), sum(1 for c in compiles if c)
    each = round(sum(compile_us) / total / 1e3, 3) if total else None
    return XlaFigures(
        used=True,
        recorded=True,
        runs_per_step=1.0,
        compile_ms=round(sum(compile_us) / n / 1e3, 3),
        compile_steps=steps_compiling,
        compiles=total,
        compile_each_ms=each,
        lowering_each_ms=None,
        per_step_ms=tuple(round(us / 1e3, 3) for us in compile_us),
        steps=n,
        shapes=total,
        programs=0,
        ran_shapes=(),
        churn=steps_compiling >= max(2, n // 2),
        warm_up=None,
        executables=0,
        modules=0,
        compiled_shapes=(),
    )
