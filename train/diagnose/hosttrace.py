"""The host trace of one profile, read offline with xprof's converter: events, threads, nesting.

xprof's `trace_viewer@` tool strips what an input-pipeline analysis needs (iterator ids and
parent ids, dataset op names, parallelism). Its older `trace_viewer` tool, still served by
xprof 2.24 though no longer listed, keeps every TraceMe argument inline, so one conversion
gives the whole tf.data iterator tree. Conversion never trusts xprof's saved results beside
the profile (`use_saved_result: False`): a stale or damaged cache cannot change the answer.
Times are microseconds from the start of the capture.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

TRACE_TOOL = "trace_viewer"


class ProfileError(Exception):
    """The profile could not be read or converted; the message names the file and why."""


@dataclass(eq=False, slots=True)
class Event:
    name: str
    ts: float
    end: float
    thread: str  # the thread's name without its numeric suffix: "python", "tf_data_iterator_resource"
    tid: tuple[int, int]  # (process id, thread id) as the trace numbers them
    args: dict
    parent: Event | None = None  # innermost event on the same thread that encloses this one

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
    events: list[Event]  # complete ("X") events, sorted by start
    processes: dict[int, str] = field(default_factory=dict)  # pid -> "/host:CPU", "/device:GPU:0", ...

    def named(self, *names: str) -> list[Event]:
        wanted = set(names)
        return [e for e in self.events if e.name in wanted]


def xprof_tool(xplanes: list[str], tool: str, options: dict | None = None):
    """xprof's output for one tool, with its C++ logging kept off the terminal and quoted on failure."""
    from xprof.convert import raw_to_tool_data

    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            data, _ = raw_to_tool_data.xspace_to_tool_data(
                xplanes, tool, {"use_saved_result": False, **(options or {})}
            )
            error = None
        except Exception as raised:  # the converter raises plain exceptions on some bad files
            data, error = None, f"{type(raised).__name__}: {raised}"
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        log = captured.read().decode(errors="replace")
    if not data:
        said = error or _converter_message(log) or "it returned nothing"
        raise ProfileError(_unreadable(xplanes, f"xprof's converter says: {said}"))
    return data


def _converter_message(log: str) -> str:
    """The converter's own error lines ("Can't parse ... as binary proto"), without their log prefixes."""
    lines = [re.sub(r"^[EWF]\d{4} [\d:. ]+\d+ [\w.]+:\d+\] ", "", line).strip() for line in log.splitlines()]
    lines = [line for line in lines if line and "No UnifiedProfileProcessor registered" not in line]
    return "; ".join(dict.fromkeys(lines))[:300]


def _unreadable(xplanes: list[str], said: str) -> str:
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


def load(xplane: str | Path) -> HostTrace:
    """Every complete event of one .xplane.pb, with its thread and same-thread nesting."""
    xplane = Path(xplane)
    if not xplane.is_file():
        raise ProfileError(_unreadable([str(xplane)], "it is a folder or special file, not a profile file"))
    data = xprof_tool([str(xplane)], TRACE_TOOL)
    try:
        trace = json.loads(data)
        raw = trace["traceEvents"]
    except (ValueError, TypeError, KeyError) as error:
        raise ProfileError(_unreadable([str(xplane)], f"xprof's trace of it is not valid JSON ({error})")) from None
    threads, processes, events = {}, {}, []
    for item in raw:
        if not isinstance(item, dict):
            continue
        if item.get("ph") == "M":
            name = (item.get("args") or {}).get("name", "")
            if item.get("name") == "thread_name":
                threads[(item.get("pid"), item.get("tid"))] = str(name).split("/")[0]
            elif item.get("name") == "process_name":
                processes[item.get("pid")] = str(name)
    for item in raw:
        if not isinstance(item, dict) or item.get("ph") != "X":
            continue
        try:
            ts, dur = float(item["ts"]), float(item.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        key = (item.get("pid"), item.get("tid"))
        events.append(
            Event(str(item.get("name", "")), ts, ts + max(dur, 0.0), threads.get(key, "?"), key, item.get("args") or {})
        )
    if not events:
        raise ProfileError(
            f"the profile {xplane} holds no host events ({xplane.stat().st_size} bytes): the capture recorded "
            "nothing, or it stopped before any step ran. Capture the profile again over a few training steps."
        )
    events.sort(key=lambda e: (e.ts, -e.end))
    _nest(events)
    return HostTrace(xplane, events, processes)


def _nest(events: list[Event]) -> None:
    """Set each event's parent: the innermost event on its thread that is open when it starts and encloses it."""
    stacks: dict[tuple[int, int], list[Event]] = {}
    for event in events:  # sorted by start, longer first on ties
        stack = stacks.setdefault(event.tid, [])
        while stack and stack[-1].end < event.end - 1e-3:
            stack.pop()
        event.parent = stack[-1] if stack else None
        stack.append(event)
