"""Errors meant for the person at the keyboard, not for a stack trace."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix: the message names the file, key or value and the fix.

    The command line prints it as one paragraph and exits with status 2, without a traceback.
    """


class Stopped(Exception):
    """A command stopped on request (SIGTERM, Ctrl-C) after keeping what it had finished.

    The command line prints it as one line and exits with `status`: 128 + the signal's number
    (143 for SIGTERM, 130 for SIGINT), as a process killed by that signal would.
    """

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status
