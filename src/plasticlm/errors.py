"""The one exception type for mistakes a user can cause and fix."""


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
