"""Profile analysis with xprof's converter, offline: no TensorBoard server, no TensorFlow import.

For every run with a profile: the step breakdown (step time, waiting for input, host
compute, device compute, other), the share of step time spent waiting for input, the
device busy share where a device exists, and the tf.data stages that made the step wait
(train/diagnose/input_wait.py). Steps come from step markers, or are inferred from the host
trace where the profile has none (the stock Keras TensorBoard callback): then xprof reports
no step time, and the figures here come from the trace alone, labelled inferred.
xprof's JSON is a list of gviz tables whose order changes between versions, so tables
are found by the keys they carry, never by position.
"""

from __future__ import annotations

from pathlib import Path

from train.diagnose import hosttrace, input_wait, step_windows
from train.diagnose.hosttrace import ProfileError  # noqa: F401 (callers catch analysis.ProfileError)

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
INPUT_BOUND_HIGH = 20.0  # xprof's own thresholds: "HIGHLY" and "MODERATELY" input-bound
INPUT_BOUND_MODERATE = 5.0


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

    data = hosttrace.xprof_tool(xplanes, tool)
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


def analyze_session(session: Path) -> dict:
    """The step breakdown, input share and blocking tf.data stages of one profile session."""
    xplanes = sorted(str(p) for p in Path(session).glob("*.xplane.pb"))
    if not xplanes:
        raise ProfileError(f"{session} holds no .xplane.pb file")
    wait, steps = None, None
    for xplane in xplanes:  # every host file must be readable; the first with steps is analysed
        trace = hosttrace.load(xplane)
        found = step_windows.find(trace)
        if wait is None and found is not None:
            steps, wait = found, input_wait.analyze(trace, found)
    if wait is None:
        wait = {
            "measured": False,
            "reason": "the profile shows no training steps (no step markers, no Keras batches, "
            "no repeated tf.function)",
        }
    tables = _tool_data(xplanes, "input_pipeline_analyzer")
    step_table = _table_with(tables, "steptime_ms_average")
    if step_table is None:
        raise ProfileError(f"xprof's input-pipeline analysis of {session} has no step-time table")
    props = step_table["p"]
    xprof_figures = {name: float(props.get(key) or 0.0) for name, key in STEP_FIELDS.items()}
    xprof_steps = _rows(step_table)
    diagnostics = [r.get("message") for r in _rows(_table_with(tables, "severity")) if r.get("message")]
    hardware = props.get("hardware_type", "unknown")
    has_device = hardware not in ("CPU_ONLY", "unknown", "")
    has_markers = bool(xprof_steps) and xprof_figures["step_time_ms"] > 0
    measured = bool(wait.get("measured"))
    if has_markers:
        figures = xprof_figures
    elif measured:  # no step xprof can see: the breakdown of the inferred steps, from the trace
        figures = dict.fromkeys(STEP_FIELDS, 0.0)
        figures.update(
            step_time_ms=wait["step_ms"],
            input_ms=wait["input_ms"],
            host_compute_ms=wait["compute_ms"],
            other_ms=wait["overhead_ms"],
        )
    else:
        figures = xprof_figures
    step_ms = figures["step_time_ms"]
    if measured:
        input_share = wait["input_percent"]
    else:
        input_share = 100 * figures["input_ms"] / step_ms if has_markers and step_ms else None
    return {
        "session": str(session),
        "hosts": [Path(p).name.removesuffix(".xplane.pb") for p in xplanes],
        "hardware_type": hardware,
        "has_step_markers": has_markers,
        "steps_inferred": bool(steps and steps.inferred),
        "step_source": steps.source if steps else None,
        "steps": len(xprof_steps) if has_markers else (wait.get("steps") or 0),
        **figures,
        "input_bound_percent": input_share,
        "xprof_input_percent": 100 * xprof_figures["input_ms"] / xprof_figures["step_time_ms"] if has_markers else None,
        "device_busy_percent": 100 * figures["device_compute_ms"] / step_ms if step_ms and has_device else None,
        "conclusion": props.get("input_conclusion", ""),
        "diagnostics": diagnostics,
        "slow_stages": _slow_stages(wait),
        "input_pipeline": wait,
    }


def _slow_stages(wait: dict, top: int = 5) -> list[dict]:
    """tf.data stages ranked by the input wait they caused (pass-through stages such as Prefetch never count)."""
    input_ms = wait.get("input_ms") or 0.0
    stages = [
        {
            "name": s["path"],
            "stage": s["kind"],
            "self_time_ms": round(s["blocking_ms"] + s["fill_ms"], 3),
            "self_time_percent": round(100 * (s["blocking_ms"] + s["fill_ms"]) / input_ms, 1) if input_ms else 0.0,
            "step_percent": round(100 * (s["blocking_ms"] + s["fill_ms"]) / wait["step_ms"], 1),
            "count": int(round(s["calls_per_step"] * (wait.get("steps") or 0))),
        }
        for s in wait.get("stages", [])
        if not s["pass_through"] and s["blocking_ms"] + s["fill_ms"] > 0
    ]
    stages.sort(key=lambda s: s["self_time_ms"], reverse=True)
    return stages[:top]


def analyze_run(run_dir: Path) -> dict | None:
    """The analysis of the newest profile in one run folder, or None when it has none."""
    sessions = find_profile_sessions(run_dir)
    own = sessions.get(".")
    if own is None and sessions:
        own = sessions[sorted(sessions)[0]]
    return analyze_session(own) if own else None
