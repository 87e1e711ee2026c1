"""xprof's converter in a process of its own, serving xprof_converter.py.

xprof's C++ converter can crash on a damaged profile that still parses as an XSpace (CI met a segmentation
fault in `input_pipeline_analyzer` on a profile with flipped bytes), and a crash ends the process it runs in.
Run here, it ends this one, not the diagnosis or the TensorBoard serving the Diagnose tab; the next request
starts another. One process serves every request of its parent, so Python and xprof start once (0.1 s).

Requests come one JSON line at a time on stdin: {"tool", "options", "xplanes", "out", "log"}; the tool's
output is written to `out`, its C++ log to `log`, and the reply is one JSON line, {"written", "error",
"peak_kb"}: what the converter raised, and this process's peak memory so far. EOF on stdin (the parent gone)
ends it. Run by path, not as a module, so that it needs nothing importable but xprof.
"""

import json
import os
import sys


def main() -> int:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything xprof prints goes to stderr, never into the replies
    from xprof.convert import raw_to_tool_data

    for line in sys.stdin:
        replies.write(json.dumps(_convert(raw_to_tool_data, **json.loads(line))) + "\n")
        replies.flush()
    return 0


def _convert(converter, tool: str, options: dict, xplanes: list[str], out: str, log: str) -> dict:
    """Every request gets its answer: a request whose folder is gone (its caller was interrupted) too."""
    try:
        data = _logged(converter, tool, options, xplanes, log)
        if data:
            with open(out, "wb") as handle:
                handle.write(data.encode() if isinstance(data, str) else data)
        error = None
    except Exception as raised:  # the converter raises plain exceptions on some bad files
        data, error = None, f"{type(raised).__name__}: {raised}"
    return {"written": bool(data), "error": error, "peak_kb": _peak_kb()}


def _logged(converter, tool: str, options: dict, xplanes: list[str], log: str):
    """The converter's output, its C++ log (written to fd 2) in the file `log`."""
    with open(log, "wb") as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            return converter.xspace_to_tool_data(xplanes, tool, options)[0]
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _peak_kb() -> int:
    """This process's peak resident memory since its exec (VmHWM; the converter holds the whole profile)."""
    try:
        with open("/proc/self/status") as status:
            return int(next((line.split()[1] for line in status if line.startswith("VmHWM:")), 0))
    except OSError:  # not Linux
        return 0


if __name__ == "__main__":
    sys.exit(main())
