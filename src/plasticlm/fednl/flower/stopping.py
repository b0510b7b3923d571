"""How a run is stopped and how it says it has ended: files in its run folder, because the
simulation's server runs in another process and a deployed run's folder is where its operator
looks."""

from __future__ import annotations

import time
from pathlib import Path

from flwr.app import Message
from flwr.serverapp import Grid

from plasticlm.runs import write_text_atomic


class RunStopped(Exception):
    """The run was asked to stop (a signal); the rounds committed so far stay."""


# A run is asked to stop by a file in its folder: the simulation's server runs in another
# process, and a deployed run's folder is where its operator looks.
STOP_FILE = "stop-requested"


# Why the server gave up, in one line, for the process that submitted the run.
ERROR_FILE = "server-error.txt"


# Written when the server leaves, whatever the reason: the run folder is final from then on
# (Flower's processes may still be winding down).
DONE_FILE = "server-done"


class StopRequest:
    """A stop asked of a run (``touch RUN_DIR/stop-requested``): the server gives up at its
    next poll for nodes or replies. It looks only while it waits, so a round being committed is
    finished first. The file holds the number of the signal that asked, if one did."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / STOP_FILE

    def set(self, signum: int = 0) -> None:
        write_text_atomic(self.path, f"{signum}\n")

    def is_set(self) -> bool:
        return self.path.exists()

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    @property
    def signum(self) -> int:
        try:
            return int(self.path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0


class StoppableGrid:
    """A Grid whose waits give up as soon as a stop is asked: Flower's ``send_and_receive``
    only returns when every reply is in or ``round_timeout`` has passed."""

    def __init__(self, grid: Grid, stop: StopRequest, interval: float = 0.1):
        self._grid, self._stop, self._interval = grid, stop, interval

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def _check(self) -> None:
        if self._stop.is_set():
            raise RunStopped(f"stop asked by signal {self._stop.signum}")

    def get_node_ids(self):
        self._check()
        return self._grid.get_node_ids()

    def send_and_receive(self, messages, *, timeout: float | None = None) -> list[Message]:
        self._check()
        waiting = set(self._grid.push_messages(messages))
        end = time.time() + (timeout or 0.0)
        replies: list[Message] = []
        while waiting and (timeout is None or time.time() < end):
            self._check()
            got = list(self._grid.pull_messages(waiting))
            replies.extend(got)
            waiting -= {m.metadata.reply_to_message_id for m in got}
            if waiting:
                time.sleep(self._interval)
        return replies
