"""Importing TensorFlow without its start-up log, for the command line.

TensorFlow prints oneDNN and CPU-feature notes and absl's "All log messages before
absl::InitializeLog() is called are written to STDERR" while it is imported, before its logging
is set up, so TF_CPP_MIN_LOG_LEVEL does not reach them. They bury the one line a command prints.
A user who sets TF_CPP_MIN_LOG_LEVEL gets everything; otherwise the C++ stderr is silenced for
the import alone (Python's own errors still surface).
"""

from __future__ import annotations

import os
import sys

from train.core.errors import UserError

QUIET = "TF_CPP_MIN_LOG_LEVEL" not in os.environ
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def import_tensorflow() -> None:
    if not QUIET or "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import tensorflow  # noqa: F401
    except ImportError as error:
        raise UserError(
            f"TensorFlow does not import ({error}). Rerun with TF_CPP_MIN_LOG_LEVEL=0 to see its own log, and "
            "check the install with `make setup`."
        ) from None
    finally:
        os.dup2(saved, 2)
        os.close(devnull)
        os.close(saved)
