"""The one exception type for mistakes a user can cause and fix."""

from __future__ import annotations

from typing import Any


class PlasticError(Exception):
    """A user-facing error: the message says what was wrong and what to do.

    The CLI prints it on one line and exits with status 2, without a traceback.
    """


class Stopped(PlasticError):
    """A run stopped by a signal (Ctrl-C, SIGTERM) at a consistent point; it can resume.

    The CLI prints the message on one line and exits with 128 + the signal's number, as a
    shell reports a process ended by that signal.
    """

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.status = 128 + signum


def clip(value: Any, limit: int = 120) -> str:
    """``value`` as an error message shows it: its text, control characters escaped, cut in
    the middle past ``limit`` characters (a 100,000-character name is not echoed whole)."""
    text = str(value)
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(text) <= limit:
        return text
    half = max(1, (limit - 5) // 2)
    return f"{text[:half]} ... {text[-half:]} ({len(str(value))} characters)"
