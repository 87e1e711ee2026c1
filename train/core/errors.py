"""Errors meant for the person at the keyboard, not for a stack trace."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """A problem the user can fix: the message names the file, key or value and the fix.

    The CLI prints it as one paragraph and exits with status 2, without a traceback.
    """


class RunFailed(Exception):
    """A run stopped by something outside it (a lost peer, a stalled service), not by bad input.

    The CLI prints it as one paragraph and exits with status 3, like the stall watchdog:
    what was checkpointed is kept, and rerunning the same command resumes.
    """


class Stopped(Exception):
    """A run stopped on request (SIGTERM, Ctrl-C) after saving a checkpoint to resume from.

    The CLI prints it as one line and exits with `status`: 128 + the signal's number
    (143 for SIGTERM, 130 for SIGINT), as a process killed by that signal would.
    """

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' Did you mean 'x'?' when a close match exists, else ''."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" Did you mean '{match[0]}'?" if match else ""
