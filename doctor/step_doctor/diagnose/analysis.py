"""Profile analysis, offline: no TensorBoard server, no TensorFlow import.

For every run with a profile: the step breakdown (step time, waiting for input, host
compute, device compute, other), the share of step time spent waiting for input, the
device busy share where a device exists, and the tf.data stages that made the step wait
(diagnose/input_wait.py). Steps come from step markers, or are inferred from the host
trace where the profile has none (the stock Keras TensorBoard callback): then xprof reports
no step time, and the figures here come from the trace alone, labelled inferred.

The host trace is read from the file in place (hosttrace.py, activity.py), so memory does not grow
with the profile; xprof's own step breakdown (its converter, offline) holds the whole file in
memory (what each costs against profile size: docs/figures.md, "bench-diagnose"): it
is kept for profiles up to XPROF_MAX_MB and skipped above, or where its converter crashed (it
runs in a child process, xprof_converter.py): then the figures come from the trace alone and
the profile says which were skipped and why.
xprof's JSON is a list of gviz tables whose order changes between versions, so tables
are found by the keys they carry, never by position.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

from step_doctor.diagnose import (
    activity,
    hosttrace,
    input_wait,
    jax_steps,
    step_windows,
    xla,
    xprof_converter,
    xspace,
)
from step_doctor.diagnose.hosttrace import ProfileError  # noqa: F401 (callers catch analysis.ProfileError)
from step_doctor.diagnose.profile_record import Profile, SlowStage, StepBreakdown
from step_doctor.diagnose.wait_record import InputWait, Unmeasured, Wait

STEP_FIELDS = {  # our name -> xprof's key in the step table's properties
    "step_time_ms": "steptime_ms_average",
    "input_ms": "infeed_time_ms_avg",
    "host_compute_ms": "host_compute_time_ms_avg",
    "device_compute_ms": "device_compute_time_ms_avg",
    "device_to_device_ms": "device_to_device_time_ms_avg",
    "device_collectives_ms": "device_collectives_time_ms_avg",
    "kernel_launch_ms": "kernel_launch_time_ms_avg",
    "compile_ms": "compile_time_ms_avg",
    "output_ms": "outfeed_time_ms_avg",
    "other_ms": "other_time_ms_avg",
}
INPUT_BOUND_HIGH = 20.0  # xprof's own threshold: "HIGHLY" input-bound
# xprof's conversion holds the whole profile in memory, its time and memory growing with the profile (docs/figures.md,
# "bench-diagnose"; docs/doctor.md, "diagnose at scale"). Above this size its breakdown would cost more than the rest
# of the analysis: skipped.
XPROF_MAX_MB = 8.0
# Past this size TensorBoard's Profile tab needs several GB of memory to open the profile (20-30 GB per GB,
# tensorboard#6132, xprof#65): the profile says how it was read and how to capture one that opens.
LARGE_MB = 100.0


def find_profile_sessions(logdir: Path) -> dict[str, Path]:
    """{run name (relative to logdir): newest profile session folder} for every run under logdir."""
    logdir = Path(logdir)
    sessions = {}
    for profile_dir in sorted(logdir.rglob("plugins/profile")):
        candidates = sorted(p for p in profile_dir.iterdir() if p.is_dir() and any(p.glob("*.xplane.pb")))
        if candidates:
            run = profile_dir.parent.parent.relative_to(logdir).as_posix()
            sessions["." if run == "." else run] = candidates[-1]
    return sessions


def _tool_data(xplanes: list[str], tool: str) -> list:
    """xprof's JSON for one tool (its C++ logging kept off the terminal, quoted in the error)."""
    import json

    data = xprof_converter.xprof_tool(xplanes, tool)
    try:
        return json.loads(data)
    except ValueError as error:
        raise ProfileError(f"xprof's '{tool}' output for {xplanes[0]} is not valid JSON ({error})") from None


def _table_with(tables: list, key: str) -> dict | None:
    """The first gviz table whose properties or columns carry `key` (tables move between versions)."""
    for table in tables:
        if not isinstance(table, dict):
            continue
        if key in table.get("p", {}) or any(col.get("id") == key for col in table.get("cols", [])):
            return table
    return None


def _rows(table: dict | None) -> list[dict]:
    if not table:
        return []
    ids = [col.get("id") for col in table.get("cols", [])]
    return [{k: (cell or {}).get("v") for k, cell in zip(ids, row.get("c", []))} for row in table.get("rows", [])]


def _hardware(space) -> str:
    """xprof's name for the profile's accelerator, from the planes alone."""
    names = [p.name for p in activity.device_planes(space)]
    if any(n.startswith("/device:GPU") for n in names):
        return "GPU"
    if any(n.startswith("/device:TPU") for n in names):
        return "TPU"
    return "CPU_ONLY" if not names else "unknown"


def analyze_session(session: Path) -> Profile:
    """The step breakdown, input share and blocking tf.data stages of one profile session."""
    started = time.perf_counter()
    xplanes = sorted(str(p) for p in Path(session).glob("*.xplane.pb"))
    if not xplanes:
        raise ProfileError(f"{session} holds no .xplane.pb file")
    size_mb = sum(Path(x).stat().st_size for x in xplanes) / 1e6
    with_xprof = size_mb <= XPROF_MAX_MB
    if with_xprof:
        xprof_converter.prepare()
    wait, steps, planes_say, jax_made = None, None, "CPU_ONLY", False
    said: dict[str, list[str]] = {"errors": [], "warnings": []}  # by the profiler while capturing, e.g. CUPTI's
    companions = [x for x in xplanes if x.endswith(COMPANION)]  # TensorFlow's capture beside JAX's (jax_capture.py)
    for xplane in [x for x in xplanes if x not in companions]:  # every host file must be readable
        trace = hosttrace.load(xplane)
        said["errors"] += [e for e in trace.space.errors if e not in said["errors"]]
        said["warnings"] += [w for w in trace.space.warnings if w not in said["warnings"]]
        try:
            if trace.jax:
                for companion in companions:
                    merged = _companion(companion)
                    if merged is not None:
                        hosttrace.merge(trace, merged)
                found = jax_steps.find(trace)
            else:
                found = xla.without_warm_up(trace, step_windows.find(trace))
            if wait is None and found is not None:  # the first with steps is analysed
                analyzer = jax_steps.analyze if trace.jax else input_wait.analyze
                steps, wait = found, analyzer(trace, found)  # streams the device planes too
                planes_say, jax_made = _hardware(trace.space), trace.jax
        except xspace.XSpaceError as error:
            raise ProfileError(hosttrace.unreadable([xplane], str(error))) from None
        finally:
            trace.close()
    if wait is None:
        wait = Unmeasured(
            "the profile shows no training steps (no step markers, no Keras batches, no repeated tf.function)"
        )
    xprof, skipped = None, [f"{_XPROF_BREAKDOWN}: {_TOO_LARGE_FOR_XPROF.format(mb=size_mb)}"]
    if jax_made:
        skipped = [f"{_XPROF_BREAKDOWN}: {_JAX_MADE}"]
    elif with_xprof:
        try:
            xprof, skipped = _xprof_breakdown(xplanes, session), []
        except xprof_converter.ConverterCrashed as crash:
            skipped = [f"{_XPROF_BREAKDOWN}: {crash}. {_CRASHED_XPROF}"]
    profile_mb, seconds = round(size_mb, 2), round(time.perf_counter() - started, 1)
    return _profile(
        xprof,
        wait,
        steps,
        planes_say,
        session=str(session),
        hosts=tuple(Path(p).name.removesuffix(".xplane.pb") for p in xplanes),
        steps_inferred=bool(steps and steps.inferred),
        step_source=steps.source if steps else None,
        slow_stages=_slow_stages(wait),
        profile_mb=profile_mb,
        analysis_seconds=seconds,
        skipped=tuple(skipped),
        stall_ms=wait.stall_ms if isinstance(wait, InputWait) and wait.measured else None,
        profiler_errors=tuple(said["errors"]),
        profiler_warnings=tuple(said["warnings"]),
        large_profile=_large_note(profile_mb, seconds) if size_mb >= LARGE_MB else None,
    )


_XPROF_BREAKDOWN = (
    "xprof's own step breakdown (its step time, input, host and device compute, launch, compile and copy times, "
    "conclusion and diagnostics)"
)
_TOO_LARGE_FOR_XPROF = (
    "its converter reads the whole {mb:,.0f} MB profile into memory (about 20 MB of memory and 0.2 s per MB of "
    "profile), more than the rest of the analysis costs. The figures here come from the trace itself."
)
_CRASHED_XPROF = "The figures here come from the trace itself; if they look wrong too, capture the profile again."
_JAX_MADE = (
    "not read for a profile made by JAX's profiler: xprof counts as input the time in tf.data's infeed, which a JAX "
    "step does not run. The figures here come from the trace itself (diagnose/jax_steps.py)."
)
COMPANION = "-tensorflow.xplane.pb"


def _companion(xplane: str) -> hosttrace.HostTrace | None:
    """TensorFlow's file beside JAX's: its events are merged into JAX's trace, the file itself closed. None where it
    recorded nothing (the script imported TensorFlow and fed its steps otherwise)."""
    try:
        trace = hosttrace.load(xplane)
    except ProfileError:
        if Path(xplane).is_file() and Path(xplane).stat().st_size < 4096:  # an empty capture: no tf.data ran
            return None
        raise
    trace.close()
    return trace


def _large_note(profile_mb: float, seconds: float) -> str:
    return (
        f"This profile is {profile_mb:,.0f} MB. diagnose read only the host threads it needs (steps, input "
        "waits, tf.data) and reduced the device planes to per-step totals as it streamed them, in "
        f"{seconds:.0f} s. TensorBoard's Profile tab loads the whole profile (20-30 GB of memory "
        "per GB): to open one there, capture a smaller window, e.g. 3 steps: "
        "StepTraceProfiler(logdir, start_step=10, num_steps=3), or keras.callbacks.TensorBoard(profile_batch=(10, 12))."
    )


class _Xprof(NamedTuple):
    """xprof's step table: its figures, its steps, diagnostics, conclusion and hardware type."""

    figures: StepBreakdown
    steps: int
    diagnostics: tuple[str, ...]
    hardware: str
    conclusion: str


def _xprof_breakdown(xplanes: list[str], session: Path) -> _Xprof:
    tables = _tool_data(xplanes, "input_pipeline_analyzer")
    step_table = _table_with(tables, "steptime_ms_average")
    if step_table is None:
        raise ProfileError(f"xprof's input-pipeline analysis of {session} has no step-time table")
    props = step_table["p"]
    return _Xprof(
        figures=StepBreakdown(**{name: float(props.get(key) or 0.0) for name, key in STEP_FIELDS.items()}),
        steps=len(_rows(step_table)),
        diagnostics=tuple(r.get("message") for r in _rows(_table_with(tables, "severity")) if r.get("message")),
        hardware=props.get("hardware_type", "unknown"),
        conclusion=props.get("input_conclusion", ""),
    )


def _trace_figures(wait: InputWait) -> StepBreakdown:
    """The step breakdown of the trace's own steps (a stall is "other" here too)."""
    device = wait.device
    return StepBreakdown(
        step_time_ms=wait.step_ms,
        input_ms=wait.input_ms,
        host_compute_ms=wait.host_compute_ms if device else wait.compute_ms,
        device_compute_ms=device.busy_ms if device else 0.0,
        device_to_device_ms=device.d2d_ms if device else 0.0,
        device_collectives_ms=0.0,
        kernel_launch_ms=device.launch_ms if device else 0.0,
        compile_ms=wait.compile_ms,
        output_ms=device.d2h_ms if device else 0.0,
        other_ms=round(wait.overhead_ms + wait.stall_ms, 3),
    )


def _profile(xprof: _Xprof | None, wait: Wait, steps, planes_say: str, **about) -> Profile:
    """The profile with its step breakdown: xprof's where it ran and saw marked steps, else the trace's own. `about`:
    the rest of the profile's fields."""
    hardware = xprof.hardware if xprof else planes_say
    has_device = hardware not in ("CPU_ONLY", "unknown", "")
    if xprof:
        has_markers = bool(xprof.steps) and xprof.figures.step_time_ms > 0
    else:
        has_markers = bool(steps) and steps.source == step_windows.MARKERS and wait.measured
    measured = isinstance(wait, InputWait) and wait.measured
    # XLA compiling in the steps: xprof never classifies a TensorFlow host event as compile (on a CPU it is host
    # compute; a GPU profile's step time leaves it out), and its figures count the warm-up steps left out here
    compiled = measured and bool(wait.compile_ms or wait.xla.warm_up)
    if xprof and has_markers and not compiled and not (measured and wait.jax):
        figures = xprof.figures
    elif measured:  # no step xprof can see, or xprof not run: the breakdown of the steps, from the trace
        figures = _trace_figures(wait)
    else:
        figures = xprof.figures if xprof else StepBreakdown(**dict.fromkeys(STEP_FIELDS, 0.0))
    step_ms = figures.step_time_ms
    if measured:
        input_share = wait.input_percent
    else:
        input_share = 100 * figures.input_ms / step_ms if has_markers and step_ms else None
    xprof_step = xprof.figures.step_time_ms if xprof else 0.0
    return Profile(
        hardware_type=hardware,
        has_step_markers=has_markers,
        steps=xprof.steps if xprof and has_markers and not compiled else _steps(wait),
        breakdown=figures,
        input_bound_percent=input_share,
        xprof_input_percent=100 * xprof.figures.input_ms / xprof_step if xprof and has_markers else None,
        device_busy_percent=100 * figures.device_compute_ms / step_ms if step_ms and has_device else None,
        conclusion=xprof.conclusion if xprof and not compiled else "",  # else of figures not shown
        diagnostics=xprof.diagnostics if xprof else (),
        wait=wait,
        **about,
    )


def _steps(wait: Wait) -> int:
    return (wait.steps or 0) if isinstance(wait, InputWait) else 0


def _slow_stages(wait: Wait, top: int = 5) -> tuple[SlowStage, ...]:
    """tf.data stages ranked by the input wait they caused (pass-through stages such as Prefetch never count)."""
    if not isinstance(wait, InputWait):
        return ()
    input_ms = wait.input_ms or 0.0
    stages = [
        SlowStage(
            name=s.path,
            stage=s.kind,
            self_time_ms=round(s.blocking_ms + s.fill_ms, 3),
            self_time_percent=round(100 * (s.blocking_ms + s.fill_ms) / input_ms, 1) if input_ms else 0.0,
            step_percent=round(100 * (s.blocking_ms + s.fill_ms) / wait.step_ms, 1),
            count=int(round(s.calls_per_step * _steps(wait))),
        )
        for s in wait.stages
        if not s.pass_through and s.blocking_ms + s.fill_ms > 0
    ]
    stages.sort(key=lambda s: s.self_time_ms, reverse=True)
    return tuple(stages[:top])


def analyze_run(run_dir: Path) -> Profile | None:
    """The analysis of the run's own newest profile, else the newest of its sub-runs' (the Keras callback
    writes into run/train/); None when it has none."""
    sessions = find_profile_sessions(run_dir)
    own = sessions.get(".")
    if own is None and sessions:
        # session folders are named by capture time (2026_12_03_18_05_29); the newest capture is the run's last word
        own = max(sessions.values(), key=lambda session: (session.name, session.stat().st_mtime))
    return analyze_session(own) if own else None
