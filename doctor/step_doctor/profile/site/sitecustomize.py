"""Python runs this file at start-up in every process that `step-doctor profile` starts.

Why a sitecustomize on a private PYTHONPATH entry rather than a `python -m` runpy wrapper: it
reaches every Python process the command starts, not only a `python script.py` we could rewrite
(launchers, shell scripts, console scripts, multi-worker processes started by the script), and it
leaves the script's `__main__`, `sys.argv` and `sys.path[0]` exactly as they are without profile.
It does two things: load capture.py, which waits for the script to import TensorFlow, and then run
the next sitecustomize on the path (a virtualenv's or the distribution's), as Python would have.
Python started with -I, -E or -S skips it; the parent says so when no process reported back.
"""

import importlib
import importlib.util
import os
import sys

CAPTURE = "_step_doctor_profile_capture"  # a name no user module has; this folder is not a package on the path


def _load_capture() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(CAPTURE, os.path.join(here, "capture.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[CAPTURE] = module
    spec.loader.exec_module(module)
    module.install()


def _chain() -> None:
    """Import the sitecustomize that this one shadows, if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError as error:
        if error.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = ours
    finally:
        sys.path[:] = saved


if __name__ == "sitecustomize":  # only as Python's start-up hook, never when imported as step_doctor.profile.site...
    try:
        _load_capture()
    except Exception as error:  # never stop the user's script: report and run it without the capture
        print(f"profile: no capture in this process ({type(error).__name__}: {error})", file=sys.stderr)
    _chain()
