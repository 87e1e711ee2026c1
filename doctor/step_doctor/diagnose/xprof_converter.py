"""xprof's converter for the analysis (analysis.py), run in a child process (xprof_child.py).

xprof's C++ converter died of a segmentation fault once in CI, in `input_pipeline_analyzer`, on a profile
with flipped bytes that this package's reader (xspace.py) had read whole, and took the process with it. In a
child, a crash costs that one conversion (ConverterCrashed: the analysis keeps the trace's own figures and
says so); the next conversion starts another child. One child serves every conversion of its parent, so
Python and xprof start once (0.1 s), not once per profile.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from step_doctor.diagnose.hosttrace import ProfileError, unreadable


def xprof_tool(xplanes: list[str], tool: str, options: dict | None = None) -> bytes:
    """xprof's output for one tool, converted in a child process (xprof_child.py) so that a converter crash on a
    damaged profile costs this call (ConverterCrashed), not the process; its C++ log is quoted on failure."""
    options = {"use_saved_result": False, **(options or {})}
    with tempfile.TemporaryDirectory(prefix="step-doctor-xprof-") as scratch:
        out, log = Path(scratch) / "out", Path(scratch) / "log"
        reply = _CONVERTER.convert(
            {"tool": tool, "options": options, "xplanes": xplanes, "out": str(out), "log": str(log)}
        )
        if "crashed" in reply:
            raise ConverterCrashed(xplanes, tool, reply["crashed"])
        data = out.read_bytes() if reply["written"] else None
        said = reply["error"] or _converter_message(log.read_text(errors="replace") if log.is_file() else "")
    if not data:
        raise ProfileError(unreadable(xplanes, f"xprof's converter says: {said or 'it returned nothing'}"))
    return data


# A conversion this long is a converter stuck on a damaged file: xprof's breakdown of the largest profile it is
# given (analysis.XPROF_MAX_MB, 8 MB) takes about 2 s here, and the Diagnose tab's one worker would wait on it forever.
TIMEOUT_S = 300.0


class _Converter:
    """The child process that runs xprof's converter for this one, started on first use and after a crash."""

    def __init__(self):
        self._lock = threading.Lock()  # the Diagnose tab's worker and a request thread may both convert
        self._child: subprocess.Popen | None = None
        self.peak_kb = 0  # the children's peak resident memory (bench-diagnose adds it to this process's)
        atexit.register(self.close)
        os.register_at_fork(after_in_child=self._forked)

    def start(self) -> None:
        """Starts the child if none runs, without waiting for it to load xprof."""
        with self._lock:
            self._start()

    def convert(self, request: dict) -> dict:
        """The child's reply, or {"crashed": how} where it died or hung on this request (the next one starts
        another)."""
        with self._lock:
            self._start()
            child = self._child
            try:
                child.stdin.write(json.dumps(request) + "\n")
                child.stdin.flush()
                with selectors.DefaultSelector() as waiting:  # select.select fails on fds past 1023
                    waiting.register(child.stdout, selectors.EVENT_READ)
                    line = child.stdout.readline() if waiting.select(TIMEOUT_S) else None
            except BrokenPipeError:
                line = ""
            except BaseException:  # interrupted with a request in flight: its answer would go to the next one
                child.kill()
                self._reap()
                raise
            if line:
                reply = json.loads(line)
                self.peak_kb = max(self.peak_kb, reply.get("peak_kb", 0))
                return reply
            if line is None:
                child.kill()
                self._reap()
                return {"crashed": f"gave no answer in {TIMEOUT_S:.0f} s and was stopped"}
            return {"crashed": f"crashed ({_how_it_ended(self._reap())})"}

    def _start(self) -> None:
        if self._child is None:
            self._child = subprocess.Popen(
                [sys.executable, str(_CHILD)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,  # its log of each request goes to the request's file
                text=True,
            )

    def close(self) -> None:
        """At exit: ends the child. Where a thread is converting (the Diagnose tab's worker, a daemon), kills it
        rather than wait for the conversion: that thread sees it end and tidies up."""
        if self._lock.acquire(blocking=False):
            try:
                if self._child is not None:
                    self._reap()
            finally:
                self._lock.release()
        elif self._child is not None:
            self._child.kill()

    def _forked(self) -> None:
        """In a forked copy of this process: a lock of its own, and none of the parent's child (whose pipes, kept
        open here, would keep it waiting for requests the parent never sends)."""
        self._lock = threading.Lock()
        child, self._child = self._child, None
        if child is not None:
            with contextlib.suppress(OSError):
                child.stdin.close()
                child.stdout.close()
            child.returncode = 0  # not ours to wait for

    def _reap(self) -> int:
        """Closes the child's stdin, so that it exits once it has answered, and waits for it: its exit status."""
        child, self._child = self._child, None
        try:
            child.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
        return child.returncode


_CHILD = Path(__file__).with_name("xprof_child.py")
_CONVERTER = _Converter()


def child_peak_kb() -> int:
    """The peak resident memory of the converter's children so far, in kB: xprof holds the whole profile there
    (215 MB for a 7.2 MB profile, beside 66 MB in the process that diagnoses it)."""
    return _CONVERTER.peak_kb


def prepare() -> None:
    """Starts the converter's child now, so that it loads Python and xprof (0.1 s) while the caller reads the
    trace: on two cores, beside it rather than after it."""
    _CONVERTER.start()


class ConverterCrashed(ProfileError):
    """xprof's converter died or hung on a profile this reader could read: its breakdown is missing, the trace's
    own figures stand (analysis.py)."""

    def __init__(self, xplanes: list[str], tool: str, how: str):
        super().__init__(
            f"xprof's converter {how} in its '{tool}' tool reading {', '.join(xplanes)}, which this "
            "reader read whole: the file may be damaged, or xprof met a case it does not handle"
        )


def _how_it_ended(code: int) -> str:
    if code >= 0:
        return f"exit status {code}"
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _converter_message(log: str) -> str:
    """The converter's own error lines ("Can't parse ... as binary proto"), without their log prefixes."""
    lines = [re.sub(r"^[EWF]\d{4} [\d:. ]+\d+ [\w.]+:\d+\] ", "", line).strip() for line in log.splitlines()]
    lines = [line for line in lines if line and "No UnifiedProfileProcessor registered" not in line]
    return "; ".join(dict.fromkeys(lines))[:300]
