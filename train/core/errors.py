"""Errors meant for the person at the keyboard, not for a stack trace."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# The doctor's: the template's commands and the doctor's raise and catch the same classes.
from step_doctor.errors import Stopped, UserError

__all__ = ["RunFailed", "Stopped", "UserError", "did_you_mean"]


class RunFailed(Exception):
    """A run stopped by something outside it (a lost peer, a stalled service), not by bad input.

    The CLI prints it as one paragraph and exits with status 3, like the stall watchdog:
    what was checkpointed is kept, and rerunning the same command resumes.
    """


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' Did you mean 'x'?' when a close match exists, else ''."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" Did you mean '{match[0]}'?" if match else ""
