"""Profile analysis with xprof's converter, offline: no TensorBoard server, no TensorFlow import.

For every run with a profile: the step breakdown (step time, waiting for input, host
compute, device compute, other), the share of step time spent waiting for input, the
device busy share where a device exists, and the tf.data stages ranked by self time.
xprof's JSON is a list of gviz tables whose order changes between versions, so tables
are found by the keys they carry, never by position.
"""

from __future__ import annotations

from pathlib import Path

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


class ProfileError(Exception):
    """The profile could not be read or converted."""


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
    """xprof's JSON for one tool, with its C++ logging kept off the terminal."""
    import json
    import os
    import tempfile

    from xprof.convert import raw_to_tool_data

    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            data, _ = raw_to_tool_data.xspace_to_tool_data(xplanes, tool, {})
        except Exception as error:  # the converter raises plain exceptions on bad files
            os.dup2(saved, 2)
            raise ProfileError(f"xprof could not convert {xplanes[0]}: {error}") from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    if not data:
        raise ProfileError(f"xprof returned no '{tool}' data for {xplanes[0]}")
    return json.loads(data)


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
    """The step breakdown, input share and slowest tf.data stages of one profile session."""
    xplanes = sorted(str(p) for p in Path(session).glob("*.xplane.pb"))
    if not xplanes:
        raise ProfileError(f"{session} holds no .xplane.pb file")
    tables = _tool_data(xplanes, "input_pipeline_analyzer")
    step_table = _table_with(tables, "steptime_ms_average")
    if step_table is None:
        raise ProfileError(f"xprof's input-pipeline analysis of {session} has no step-time table")
    props = step_table["p"]
    figures = {name: float(props.get(key) or 0.0) for name, key in STEP_FIELDS.items()}
    steps = _rows(step_table)
    diagnostics = [r.get("message") for r in _rows(_table_with(tables, "severity")) if r.get("message")]
    hardware = props.get("hardware_type", "unknown")
    has_device = hardware not in ("CPU_ONLY", "unknown", "")
    step_ms = figures["step_time_ms"]
    result = {
        "session": str(session),
        "hosts": [Path(p).name.removesuffix(".xplane.pb") for p in xplanes],
        "hardware_type": hardware,
        "has_step_markers": bool(steps) and step_ms > 0,
        "steps": len(steps),
        **figures,
        "input_bound_percent": 100 * figures["input_ms"] / step_ms if step_ms else None,
        "device_busy_percent": 100 * figures["device_compute_ms"] / step_ms if step_ms and has_device else None,
        "conclusion": props.get("input_conclusion", ""),
        "diagnostics": diagnostics,
        "slow_stages": _slow_stages(tables),
    }
    return result


def _slow_stages(tables: list, top: int = 5) -> list[dict]:
    """tf.data iterators ranked by self time (where the input pipeline spends its time)."""
    rows = _rows(_table_with(tables, "selfTimeInMs"))
    stages = [
        {
            "name": str(r.get("opName")),
            "stage": str(r.get("opName")).split("::")[-1],
            "self_time_ms": float(r.get("selfTimeInMs") or 0.0),
            "self_time_percent": 100 * float(r.get("selfTimeInPercent") or 0.0),
            "count": int(r.get("count") or 0),
        }
        for r in rows
        if str(r.get("opName", "")).startswith("Iterator::")
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
