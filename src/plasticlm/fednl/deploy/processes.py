"""Flower's processes on this machine: free loopback ports, Flower's executables, the
environment they run in, and ending a process with everything it started.

Flower's runtime dependency installation and update check stay off: nothing is downloaded.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from plasticlm.errors import PlasticError
from plasticlm.process_guard import end_processes, guarded

# The Flower app of plasticlm's federated runs: a pyproject naming the ServerApp and ClientApp.
APP_DIR = Path(__file__).parent / "flower_app"
_PR_SET_PDEATHSIG = 1


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 at the time of the call."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_port(port: int, seconds: float, proc: subprocess.Popen | None = None,
              log: Path | None = None) -> None:
    """Wait until something listens on 127.0.0.1:``port``; fail early when ``proc`` exits."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-500:] if log and log.exists() else ""
            raise PlasticError(f"the SuperLink exited with status {proc.returncode} before "
                               f"opening port {port}: {tail.strip()}")
        time.sleep(0.1)
    raise PlasticError(f"the SuperLink did not open port {port} within {seconds:.0f}s")


def flower_bin(name: str) -> str:
    """The path of one of Flower's executables installed beside this Python."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise PlasticError(f"{name} is not installed next to {sys.executable}; install "
                           "flwr[simulation]==1.42.0 (make test does)")
    return str(path)


def flower_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment for Flower's processes: their own FLWR_HOME, no update
    check online, unbuffered logs, this Python's executables first on PATH (the
    SuperLink starts ``flower-superexec`` from it) and this process's import path (so the app
    imports the plasticlm this process runs, from a source tree too)."""
    return dict(os.environ, FLWR_HOME=str(home),
                FLWR_DISABLE_UPDATE_CHECK="1",
                PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                **extra)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies, even by SIGKILL (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def spawn(args: list[str], env: dict[str, str], log: Path, new_session: bool = False,
          ) -> subprocess.Popen:
    """Start ``args`` under a :mod:`~plasticlm.process_guard` with stdout and stderr appended
    to ``log``: when this process dies, even by SIGKILL, ``args`` and everything it started
    end. ``new_session``: out of this process's group, so a Ctrl-C at the terminal does not
    reach it. The returned process is the guard's: its tree is ``args``'s."""
    with log.open("a") as out:
        return subprocess.Popen(guarded(args), env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=new_session,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)


def descendants(proc: subprocess.Popen) -> list[psutil.Process]:
    """Every process ``proc`` started, at any depth (Ray's included)."""
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def end_tree(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    """SIGTERM ``procs`` and everything they started, then SIGKILL what is left after
    ``grace`` seconds. The tree is listed first: a child whose parent dies is re-parented and
    would no longer be found."""
    tree = [p for proc in procs for p in descendants(proc)]
    tops = []
    for proc in procs:
        try:
            tops.append(psutil.Process(proc.pid))
        except psutil.NoSuchProcess:
            pass
    end_processes(tops + tree, grace)
    for proc in procs:  # reap, so no zombie is left
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
