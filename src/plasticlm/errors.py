"""The one exception type for mistakes a user can cause and fix."""


class PlasticError(Exception):
    """A user-facing error: the message says what was wrong and what to do.

    The CLI prints it on one line and exits with status 2, without a traceback.
    """
