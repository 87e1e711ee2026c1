"""XLA in a profile's steps: compile time per step, the compiles, the shapes compiled, warm-up or churn.

With `jit_compile=True` (Keras's default where a GPU is present) the training step is one XLA
program: its run is the model's compute (tf_names.XLA_RUNS, counted by activity.py), and each new
input shape compiles a new program, inside the step that first meets it. From the trace:

- compile time per step: the union of XLA's compile events (tf_names.XLA_COMPILES) in the step,
  and before the first of them TensorFlow's lowering of the function to HLO, which records no event:
  from the start of the kernel that launches the program (the compile's innermost enclosing event)
  to its first compile event, where the same kernel then runs the program. Measured with
  TensorFlow 2.21 on a CPU: the named events are a median 82 % of that span (docs/xla.md).
- compiles: one CpuCompiler::RunBackend (GpuCompiler::OptimizeHloModule) each.
- shapes: the batch shapes the steps read (distinct GetNext element sizes, bytes per batch), and the
  executables alive in the process (/host:metadata: compiled before the capture too) with the
  shapes they were compiled for (hlo.py).
- churn or warm-up: where most steps compile, or bring a shape the others did not, the shapes keep
  changing and compiling is a cost of every step (step_causes.recompilation). Where the steps reuse
  a few shapes, the compiles are warm-up, paid once per shape: the steps that compiled are left out
  of the figures (as the first step is), which then describe the steady state, and a note says so.
- unrecorded: TensorFlow 2.17's XLA on a CPU (measured, at every host_tracer_level) records no event
  of its own, neither runs nor compiles; the step is one opaque kernel. Where the trace holds no XLA
  event, the process holds XLA executables (/host:metadata) and the model's ops are under OPAQUE of
  the step, XLA ran it unseen: its compute, compiling and overhead cannot be told apart, so none is
  estimated (step_causes.per_step_overhead), and a note says what is missing and what it would take.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict
from typing import NamedTuple

import numpy as np

from step_doctor.diagnose import hlo, xspace
from step_doctor.diagnose.hosttrace import HostTrace
from step_doctor.diagnose.step_windows import Steps
from step_doctor.diagnose.tf_names import XLA_COMPILE_ONCE, XLA_COMPILES, XLA_EXECUTABLE, XLA_RUNS
from step_doctor.diagnose.wait_record import InputWait, Wait, XlaFigures, XlaWarmUp

CHURN = 0.5  # steps that compile, or distinct shapes, above this share of the steps: the shapes keep changing
MIN_STEADY = 2  # warm-up steps are left out only where at least this many steps remain
METADATA = "/host:metadata"
HLO_PROTO = "Hlo Proto"
SHOWN = 6  # compiled shapes listed
PARSED = 64  # executables whose HloProto is read, at most
OPAQUE = 0.05  # model ops under this share of the step, no XLA event, XLA executables in the process: unrecorded XLA


class Executables(NamedTuple):
    """The XLA executables of the step's module alive in the process, and the input shapes they were compiled for."""

    count: int
    modules: int  # HLO modules with an executable in the process
    compiled_shapes: tuple[str, ...]  # the shapes that vary between them, in the order they were compiled
    shapes_of: dict[int, str]  # by program id


NONE = Executables(0, 0, (), {})


def _disjoint(spans) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _per_window(spans: list[tuple[float, float]], windows) -> list[float]:
    """The measure of `spans` (disjoint, in order) inside each window, µs."""
    starts = [a for a, _ in spans]
    out = []
    for lo, hi in windows:
        i, total = max(bisect.bisect_right(starts, lo) - 1, 0), 0.0
        while i < len(spans) and spans[i][0] < hi:
            total += max(min(spans[i][1], hi) - max(spans[i][0], lo), 0.0)
            i += 1
        out.append(total)
    return out


def _is_xla(plane: xspace.Plane, i: int) -> bool:
    shown = plane.display_names.get(i) or plane.event_names[i]
    return bool(XLA_COMPILES.match(shown) or XLA_RUNS.match(shown))


def _enclosers(space: xspace.XSpaceFile, line: xspace.Line, compiles: list) -> set[tuple[float, float]]:
    """The innermost event of the line around each compile event, other than XLA's own: (start, end) µs."""
    xla_ids = [i for i in line.plane.event_names if _is_xla(line.plane, i)]
    compiles = sorted(compiles, key=lambda e: e.ts)
    starts = np.array([c.ts for c in compiles])
    best: dict[int, tuple[float, float]] = {}
    base_ps = line.timestamp_ns * 1000
    for block in space.events(line):
        ts = (base_ps + block.offset_ps) / 1e6
        end = (base_ps + block.offset_ps + block.duration_ps) / 1e6
        at = np.searchsorted(starts, ts - 1e-3, side="left")  # the first compile that starts inside the event
        first = starts[np.minimum(at, len(starts) - 1)]
        around = (at < len(starts)) & (first <= end) & (block.duration_ps > 0) & ~np.isin(block.metadata_id, xla_ids)
        for k in np.flatnonzero(around):
            a, b = float(ts[k]), float(end[k])
            for j in range(int(at[k]), bisect.bisect_right(starts, b)):
                if compiles[j].end <= b + 1e-3 and (j not in best or a > best[j][0]):
                    best[j] = (a, b)
    return set(best.values())


def _lowering(trace: HostTrace) -> list[tuple[float, float]]:
    """Per compile, TensorFlow's lowering to HLO before XLA's first compile event: from the start of the kernel around
    the compile to that event, where the same kernel runs the program afterwards (it compiled what it then ran)."""
    compiles, runs = defaultdict(list), defaultdict(list)
    for event in trace.xla_compiles:
        compiles[event.tid].append(event)
    for event in trace.xla_runs:
        runs[event.tid].append(event.ts)
    found = []
    for tid, events in compiles.items():
        if tid not in runs:  # XLA's codegen threads compile, never run: no kernel of the step's there
            continue
        line = trace.space.planes[tid[0]].lines[tid[1]]
        for a, b in _enclosers(trace.space, line, events):
            first = min(e.ts for e in events if a <= e.ts and e.end <= b + 1e-3)
            ran = [t for t in runs[tid] if a <= t < b]
            if ran and min(ran) > first:
                found.append((a, first))
    return found


def _sizes(trace: HostTrace, windows) -> list[set]:
    """Per window, the distinct bytes per batch its GetNext calls returned (a batch shape each, for the same dtypes)."""
    starts = [e.ts for e in trace.get_next]
    out = []
    for lo, hi in windows:
        i, found = bisect.bisect_left(starts, lo), set()
        while i < len(starts) and starts[i] < hi:
            size = trace.get_next[i].args.get("element_size")
            if size:
                found.add(size)
            i += 1
        out.append(found)
    return out


def _counts(trace: HostTrace, windows) -> list[int]:
    """Per window, the compiles that started in it (tf_names.XLA_COMPILE_ONCE)."""
    starts = sorted(e.ts for e in trace.xla_compiles if e.name in XLA_COMPILE_ONCE)
    return [bisect.bisect_left(starts, hi) - bisect.bisect_left(starts, lo) for lo, hi in windows]


def churns(compile_steps: int, shapes: int, steps: int) -> bool:
    """Most steps compile, or most read a shape the others did not: each step may compile again."""
    return compile_steps > CHURN * steps or shapes > CHURN * steps


def unseen_compiles(wait: Wait) -> bool:
    """XLA runs the step and the batches keep changing shape, but the trace shows no compile: each new shape compiled
    where the profile records nothing of it (a TensorFlow whose compiler records no event), so per-step overhead may
    hold compile time that cannot be told apart."""
    xla = figures_of(wait)
    return bool(xla and xla.used and not xla.compiles and not xla.warm_up and xla.shapes > CHURN * xla.steps)


def unrecorded(wait: Wait) -> bool:
    """XLA ran the steps and the trace holds none of its events: the step's time outside input wait is its compute,
    compiling and overhead together (see the module's docstring)."""
    xla = figures_of(wait)
    return bool(xla and xla.used and xla.recorded is False)


def compile_spans(trace: HostTrace, lowering: list | None = None) -> list[tuple[float, float]]:
    """When XLA compiled, disjoint and in order: its compile events and the lowering before them (µs)."""
    if not trace.xla_compiles:
        return []
    return _disjoint([(e.ts, e.end) for e in trace.xla_compiles] + (_lowering(trace) if lowering is None else lowering))


def without_warm_up(trace: HostTrace, steps: Steps | None) -> Steps | None:
    """The steps, less those that compiled where the compiles are warm-up (see the module's docstring)."""
    if steps is None or not trace.xla_compiles or steps.warm_up:
        return steps
    spans = compile_spans(trace)
    compiling = [i for i, us in enumerate(_per_window(spans, steps.windows)) if us > 0]
    shapes = set().union(*_sizes(trace, steps.windows))
    n = len(steps.windows)
    if not compiling or churns(len(compiling), len(shapes), n) or n - len(compiling) < MIN_STEADY:
        return steps
    kept = [i for i in range(n) if i not in set(compiling)]
    return dataclasses.replace(
        steps,
        windows=[steps.windows[i] for i in kept],
        names=[steps.names[i] for i in kept],
        warm_up=[steps.windows[i] for i in compiling],
    )


def _outermost(runs: list) -> list:
    """The runs not inside another (an XLA may record its executable's run at two levels)."""
    return [e for e in runs if not any(XLA_RUNS.match(a.name) for a in e.ancestors())]


def _programs(trace: HostTrace, windows) -> dict[int, str]:
    """The XLA programs run in the windows: {program id: HLO module}. The run's own event carries no stat; the first
    HLO op inside it does (program_id, hlo_module), so only that one event of each run is parsed."""
    runs, starts = defaultdict(list), [lo for lo, _ in windows]
    for event in _outermost(trace.xla_runs):
        i = bisect.bisect_right(starts, event.ts) - 1
        if i >= 0 and event.ts < windows[i][1]:
            runs[event.tid].append((event.ts, event.end))
    found: dict[int, str] = {}
    for tid, spans in runs.items():
        line = trace.space.planes[tid[0]].lines[tid[1]]
        names = line.plane.stat_names
        if not {"program_id", "hlo_module"} <= set(names.values()):
            continue
        begin, end = (np.array(p) for p in zip(*sorted(spans)))
        pending, base_ps = set(range(len(begin))), line.timestamp_ns * 1000
        for block in trace.space.events(line):
            ts = (base_ps + block.offset_ps) / 1e6
            at = np.searchsorted(begin, ts, side="right") - 1
            inside = np.flatnonzero((at >= 0) & (ts > begin[np.maximum(at, 0)]) & (ts < end[np.maximum(at, 0)]))
            for k, raw in zip(inside.tolist(), block.stats(inside)):
                if int(at[k]) not in pending or not raw:
                    continue
                stats = {names.get(x.metadata_id): xspace.stat_value(x, names) for x in xspace.parse_event(raw).stats}
                if "program_id" in stats and "hlo_module" in stats:
                    found[int(stats["program_id"])] = str(stats["hlo_module"])
                    pending.discard(int(at[k]))
            if not pending:
                break
    return found


def executables(space: xspace.XSpaceFile, modules: set[str], ran: set[int], newest: bool = False) -> Executables:
    """The XLA executables alive in the process when the capture ended, of the HLO modules the steps ran or compiled
    (else of the module with the most, or with `newest` of the one compiled last: an unrecorded XLA's steps name no
    module, and tests or notebooks compile other models first), and the input shapes each was compiled for (by
    program id): those `ran`, and the first compiled, PARSED at most (a step compiled for every shape leaves
    thousands, 80 KB of HloProto each)."""
    planes = [p for p in space.planes if p.name == METADATA]
    by_module = defaultdict(list)
    for plane in planes:
        for name in plane.event_names.values():
            found = XLA_EXECUTABLE.match(name)
            if found:
                by_module[found.group(1)].append(int(found.group(2)))
    if not by_module:
        return NONE
    likeliest = (lambda m: max(by_module[m])) if newest else (lambda m: len(by_module[m]))
    mine = (modules & set(by_module)) or {max(by_module, key=likeliest)}  # (an XLA with no stats)
    others = sorted(p for m in mine for p in by_module[m] if p not in ran)
    wanted = set(sorted(ran)[:PARSED]) | set(others[: max(PARSED - len(ran), SHOWN)])
    shapes = {}
    for plane in planes:
        for name, stats in space.metadata_stats(plane, {HLO_PROTO}):
            found = XLA_EXECUTABLE.match(name)
            if found and int(found.group(2)) in wanted and isinstance(stats.get(HLO_PROTO), bytes):
                try:
                    shapes[int(found.group(2))] = hlo.parameter_shapes(stats[HLO_PROTO])
                except hlo.HloError:
                    continue
    programs = sorted(shapes)
    varying = hlo.varying([shapes[p] for p in programs])
    return Executables(
        count=sum(len(by_module[m]) for m in mine),
        modules=len(by_module),
        compiled_shapes=tuple(sorted(set(varying), key=varying.index)),
        shapes_of=dict(zip(programs, varying)),
    )


def _listed(space: xspace.XSpaceFile) -> bool:
    """Whether /host:metadata names any XLA executable (names only: no HloProto is read)."""
    return any(
        XLA_EXECUTABLE.match(name) for p in space.planes if p.name == METADATA for name in p.event_names.values()
    )


def measure(trace: HostTrace, steps: Steps, ops_ms: float = 0.0, step_ms: float = 0.0) -> XlaFigures:
    """XLA in the analysed steps (and the warm-up steps left out), per-step figures in ms. `ops_ms`
    and `step_ms`, the model's ops and the step per step, tell an XLA that records no event (unrecorded)."""
    windows, n = steps.windows, max(len(steps.windows), 1)
    lowered = _lowering(trace) if trace.xla_compiles else []
    spans = compile_spans(trace, lowered)
    compile_us = _per_window(spans, windows)
    counts = _counts(trace, windows)
    sizes = set().union(*_sizes(trace, windows))
    lowering = _per_window(_disjoint(lowered), windows)
    run_starts = sorted(e.ts for e in _outermost(trace.xla_runs))
    runs = sum(bisect.bisect_left(run_starts, hi) - bisect.bisect_left(run_starts, lo) for lo, hi in windows)
    programs = _programs(trace, windows)
    compile_steps = sum(1 for us in compile_us if us > 0)
    compiles = max(sum(counts), compile_steps)  # a compile without a RunBackend (another XLA) still compiled once
    warm = _per_window(spans, steps.warm_up)
    warm_compiles = max(sum(_counts(trace, steps.warm_up)), sum(1 for us in warm if us > 0))
    used = bool(runs or compiles or steps.warm_up)  # executables alone may be another model's, in the same process
    unrecorded = (
        not used
        and not trace.xla_runs
        and not trace.xla_compiles
        and step_ms > 0
        and ops_ms < OPAQUE * step_ms
        and _listed(trace.space)
    )
    used = used or unrecorded
    compiled = {str(e.args["name"]) for e in trace.xla_compiles if e.name in XLA_COMPILE_ONCE and e.args.get("name")}
    modules = set(programs.values()) | compiled
    found = executables(trace.space, modules, set(programs), newest=unrecorded) if used else NONE
    ran = [found.shapes_of[p] for p in sorted(programs) if p in found.shapes_of]
    return XlaFigures(
        used=used,
        recorded=not unrecorded,
        runs_per_step=round(runs / n, 2),
        compile_ms=round(sum(compile_us) / n / 1e3, 3),
        compile_steps=compile_steps,
        compiles=compiles,
        compile_each_ms=round(sum(compile_us) / compiles / 1e3, 3) if compiles else None,
        lowering_each_ms=round(sum(lowering) / compiles / 1e3, 3) if compiles else None,
        per_step_ms=tuple(round(us / 1e3, 3) for us in compile_us),
        steps=len(windows),
        shapes=len(sizes) or len(programs),
        programs=len(programs),
        ran_shapes=tuple(sorted(set(ran), key=ran.index)),
        churn=bool(compiles) and churns(compile_steps, len(sizes) or len(programs), len(windows)),
        warm_up=XlaWarmUp(
            steps=len(steps.warm_up),
            compiles=warm_compiles,
            compile_each_ms=round(sum(warm) / max(warm_compiles, 1) / 1e3, 3),
        )
        if steps.warm_up
        else None,
        executables=found.count,
        modules=found.modules,
        compiled_shapes=found.compiled_shapes,
    )


def overhead_left(overhead_ms: float, figures: XlaFigures) -> float:
    """Per-step overhead without the compile time in it (input_wait.py takes it out)."""
    return round(max(overhead_ms - figures.compile_ms, 0.0), 3)


def figures_of(wait: Wait) -> XlaFigures | None:
    """XLA's figures of a measured input wait (measure's), else None."""
    return wait.xla if isinstance(wait, InputWait) else None


def _compiled_for(xla: XlaFigures) -> str:
    shapes = xla.compiled_shapes
    if not shapes:
        return ""
    more = f" and {len(shapes) - SHOWN} more" if len(shapes) > SHOWN else ""
    return f" (compiled for {', '.join(shapes[:SHOWN])}{more})"


def summary(wait: Wait) -> str | None:
    """One line on XLA in the steps, for the text report; None where XLA did not run."""
    xla = figures_of(wait)
    if xla is None or not xla.used:
        return None
    parts = [f"{xla.runs_per_step:g} run(s) of the compiled step per step"]
    if xla.compiles:
        lowering = (
            f" (of which {xla.lowering_each_ms:.1f} ms lowering to HLO, before XLA's first compile event)"
            if xla.lowering_each_ms is not None
            else ""  # JAX's compiles: tracing, lowering and compiling together (jax_steps.py)
        )
        parts.append(
            f"{xla.compiles} compile(s) in {xla.compile_steps} of {xla.steps} steps, "
            f"{xla.compile_each_ms:.1f} ms each{lowering}"
        )
    if xla.shapes:
        parts.append(f"{xla.shapes} distinct batch shape(s) read")
    if xla.programs:
        parts.append(f"{xla.programs} executable(s) run")
    if xla.executables:
        parts.append(f"{xla.executables} executable(s) in the process{_compiled_for(xla)}")
    return "XLA: " + "; ".join(parts)


def notes(wait: Wait) -> list[str]:
    """What the trace says of XLA that no cause does: warm-up left out, compiles it cannot show, shapes that would
    compile again if XLA were on."""
    xla = figures_of(wait)
    if xla is None:
        return []
    steps, shapes = xla.steps or 0, xla.shapes or 0
    if not xla.used:
        if shapes >= 4 and shapes > CHURN * steps:
            return [
                f"{shapes} distinct batch shapes in {steps} steps: with XLA (`jit_compile=True`, Keras's default where "
                "a GPU is present) each new shape would compile the step again. Give the batches a few fixed shapes "
                "before turning it on (bucket_by_sequence_length with pad_to_bucket_boundary=True, or padded_batch to "
                "a fixed length, with drop_remainder=True)."
            ]
        return []
    warm = xla.warm_up
    if warm:
        return [
            f"XLA warm-up: {warm.steps} of the profiled steps compiled the step for a shape it had not met "
            f"({warm.compiles} compile(s), {warm.compile_each_ms:.0f} ms each), while the steps reuse {shapes} "
            "shapes, each compiled once: those steps are left out of the figures above, which are the steady state."
        ]
    if xla.compiles and not xla.churn:
        return [
            f"XLA compiled the step {xla.compiles} time(s) in {steps} steps ({xla.compile_each_ms:.0f} ms each), "
            "once per new shape while the steps reuse a few: warm-up, not counted as a cause. Profile later steps "
            "(StepTraceProfiler(logdir, start_step=...)) to see the steady state."
        ]
    if xla.compiles or wait.jax is not None:  # JAX's compiles are JAX's own events (jax_steps.py): none is unseen
        return []
    if unrecorded(wait):
        return [_unrecorded_note(wait, xla)]
    if xla.executables:
        seen = f"{xla.executables} XLA executables in the process{_compiled_for(xla)}, none compiled in the window"
    else:
        seen = "XLA runs the step, but the profile lists no executable and no compile in the window"
    text = f"{seen}: compile time is not measured here, and no gain is estimated from it."
    if unseen_compiles(wait):
        text += (
            f" The steps read {shapes} distinct batch shapes in {steps}: with XLA each new shape compiles the step, "
            "and this profile records none of it (a TensorFlow whose compiler records no event?), so the step's time "
            "outside the model's run may be compiling: no per-step overhead is estimated from it. Keep the batches to "
            "a few fixed shapes (bucket_by_sequence_length with pad_to_bucket_boundary=True, or padded_batch to a "
            "fixed length, with drop_remainder=True), or profile with a TensorFlow whose XLA records its compiles."
        )
    return [text]


UNRECORDED = "Unrecorded XLA"  # the note's first words (tests/corpus_expectations.py reads them)


def _unrecorded_note(wait: Wait, xla: XlaFigures) -> str:
    steps, shapes = xla.steps, xla.shapes
    text = (
        f"{UNRECORDED}: XLA ran the steps, {xla.executables} executables of the step in the process"
        f"{_compiled_for(xla)} (its module taken to be the one compiled last), and this profile records none of its "
        "events, neither its runs nor its compiles (TensorFlow 2.17's XLA on a CPU records none; 2.21's does): the "
        "step's time outside input wait is the model's compute, compiling and per-step overhead together, and no "
        "gain is estimated from any of them. Profile with a TensorFlow whose XLA records its events, or once with "
        "`jit_compile=False` to see the model's ops."
    )
    if unseen_compiles(wait):
        text += (
            f" The steps read {shapes} distinct batch shapes in {steps}: with XLA each new shape compiles the step "
            "again. Keep the batches to a few fixed shapes (bucket_by_sequence_length with "
            "pad_to_bucket_boundary=True, or padded_batch to a fixed length, with drop_remainder=True)."
        )
    return text
