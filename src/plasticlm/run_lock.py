"""One writer per run folder: an exclusive ``fcntl.flock`` on ``RUN/.plasticlm-lock``, taken by
a run and by its resume alike, that names its holder when it refuses a second one.

The lock belongs to the open file, not to the file on disk: it is released when its holder
exits, even by SIGKILL, so a stale lock file never blocks anyone. The descriptor is not
inherited by the processes a run starts (Python opens files close-on-exec).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from plasticlm.errors import PlasticError

LOCK_NAME = ".plasticlm-lock"


def _refusal(folder: Path, holder: str) -> PlasticError:
    who = f"process {holder}" if holder.isdigit() else "another process"
    stop = f" (or stop it: kill {holder})" if holder.isdigit() else ""
    return PlasticError(f"{folder} is in use by {who}, a plasticlm run writing it; wait for it "
                        f"to end{stop}, or choose another output folder")


class RunLock:
    """Hold ``folder`` (an existing run folder) for this process while the block runs.

    >>> with RunLock(run_dir):                   # doctest: +SKIP
    ...     train(run_dir)
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.fd: int | None = None

    def __enter__(self) -> RunLock:
        fd = os.open(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip()
            os.close(fd)
            raise _refusal(self.folder, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def refuse_if_locked(folder: str | Path) -> None:
    """Refuse (one line naming the holder) when a live process holds ``folder``; writes
    nothing. For a command about to clear or reuse a folder before it can lock it."""
    path = Path(folder) / LOCK_NAME
    if not path.is_file():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _refusal(Path(folder), os.read(fd, 32).decode("ascii", "replace").strip()) \
            from None
    finally:
        os.close(fd)
