"""A guard between plasticlm and each server process it starts, so that nothing a run started
outlives the command that owns it, even when that command dies by SIGKILL.

``python -m plasticlm.process_guard OWNER_PID -- COMMAND...`` runs COMMAND as its child and:

- is a child subreaper (Linux): a process that COMMAND starts and abandons (Flower's SuperLink
  starts the server and the simulation, which start Ray) is re-parented to the guard, not to
  init, so the whole tree stays findable;
- ends that whole tree (SIGTERM, then SIGKILL after a grace) when its owner dies: the kernel
  sends it SIGTERM (``PR_SET_PDEATHSIG``, Linux), and a watchdog sees its parent change
  (everywhere, in half a second);
- exits with COMMAND's status (dies by COMMAND's signal), after ending what COMMAND left.

Only the standard library and psutil are imported: the guard starts in a few milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
WATCH_SECONDS = 0.5
GRACE_SECONDS = 3.0


def guarded(args: list[str]) -> list[str]:
    """``args`` run under a guard owned by this process."""
    return [sys.executable, "-m", "plasticlm.process_guard", str(os.getpid()), "--", *args]


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):   # not Linux
        return False


def end_processes(procs: list[psutil.Process], grace: float = GRACE_SECONDS) -> None:
    """SIGTERM ``procs``, then SIGKILL those left after ``grace`` seconds (and reap them)."""
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)


def end_descendants(grace: float = GRACE_SECONDS) -> None:
    """End every process below this one, then whatever was started meanwhile (as a
    subreaper, those are ours too)."""
    me = psutil.Process()
    end_processes(me.children(recursive=True), grace)
    end_processes(me.children(recursive=True), 0.0)


def _on_sigterm(signum, frame) -> None:
    end_descendants()
    os._exit(128 + signum)


def _watch_owner(owner: int) -> None:
    """The owner is gone when this process is re-parented (to init or a subreaper)."""
    while os.getppid() == owner:
        time.sleep(WATCH_SECONDS)
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m plasticlm.process_guard OWNER_PID -- COMMAND...", file=sys.stderr)
        return 2
    owner, command = int(argv[0]), argv[2:]
    signal.signal(signal.SIGTERM, _on_sigterm)
    # Ctrl-C reaches COMMAND through the terminal's process group; what to do is the owner's
    # call (it asks the run to stop, then ends the tree). A handler, not SIG_IGN: an ignored
    # signal would stay ignored in COMMAND after exec.
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != owner:   # the owner died before the guard could watch it
        return 128 + signal.SIGTERM
    threading.Thread(target=_watch_owner, args=(owner,), daemon=True).start()
    child = subprocess.Popen(command)
    while True:
        try:
            pid, status = os.wait()       # reaps the orphans handed to this subreaper too
        except ChildProcessError:
            status = 0
            break
        if pid == child.pid:
            break
    end_descendants()
    code = os.waitstatus_to_exitcode(status)
    if code < 0:                          # died by a signal: so does the guard
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
