"""Flower's simulation runtime, the way Flower runs it: a SuperLink in simulation mode on
127.0.0.1 and the plasticlm Flower app submitted to it with ``flwr run``.

One SuperLink serves every run of a process (an experiment runs many), started at the first
run and ended when the process exits. Its processes (the SuperLink, each run's simulation
with Ray and the clients) are this process's children: they end with it.
"""

from __future__ import annotations

import atexit
import json
import logging
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import tomli_w

from plasticlm.fednl.processes import (
    APP_DIR,
    descendants,
    end_tree,
    flower_bin,
    flower_env,
    free_ports,
    spawn,
    wait_port,
)

log = logging.getLogger("plasticlm.fednl")
CONNECTION = "simulation"
# Flower's Ray logs say nothing a run's user needs; the clients' own errors reach the server
RAY_ENV = {"RAY_DEDUP_LOGS": "0", "RAY_DISABLE_IMPORT_WARNING": "1",
           "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}


class SimulationLink:
    """A SuperLink in simulation mode on a free loopback port with its own FLWR_HOME.

    ``submit`` starts ``flwr run`` of the plasticlm app on it (its logs streamed to a file)
    and returns the ``flwr run`` process; a run ends when that process does. ``env`` is the
    environment every run's processes get (the thread policy, the device and dtype).
    """

    def __init__(self, env: dict[str, str]):
        self.extra = dict(env)
        self.home = Path(tempfile.mkdtemp(prefix="plasticlm-flower-"))
        self.env = flower_env(self.home, **RAY_ENV, **self.extra)
        self.procs: list[subprocess.Popen] = []
        self.runs: list[subprocess.Popen] = []

    def __enter__(self) -> SimulationLink:
        (port,) = free_ports(1)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{port}"\ninsecure = true\n')
        logfile = self.home / "superlink.log"
        self.procs.append(spawn([flower_bin("flower-superlink"), "--insecure", "--simulation",
                                 "--isolation", "subprocess", "--host", "127.0.0.1", "--port",
                                 str(port)],
                                self.env, logfile))
        wait_port(port, 60, self.procs[0], logfile)
        return self

    def alive(self) -> bool:
        return bool(self.procs) and self.procs[0].poll() is None

    def submit(self, run_config: dict[str, str], federation: dict[str, int | float | str],
               logfile: Path) -> subprocess.Popen:
        """``flwr run`` the plasticlm app with ``run_config`` (the app's config keys) and
        ``federation`` (Flower's simulation settings: num-supernodes, client-resources-...)."""
        self.runs = [p for p in self.runs if p.poll() is None]   # reaps the finished ones
        config = self.home / f"run-config-{time.time_ns()}.toml"
        config.write_text(tomli_w.dumps(run_config))
        fed = " ".join(f"{k}={json.dumps(v)}" for k, v in federation.items())
        proc = spawn([flower_bin("flwr"), "run", str(APP_DIR), CONNECTION, "--stream",
                      "--run-config", str(config), "--federation-config", fed],
                     self.env, logfile)
        self.runs.append(proc)
        return proc

    def client_processes(self) -> list[psutil.Process]:
        """The simulated clients' processes (Ray actors) of the runs in flight."""
        found = []
        for p in descendants(self.procs[0]) if self.procs else []:
            try:
                if "ClientAppActor" in " ".join(p.cmdline()):
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return found

    def __exit__(self, *exc) -> None:
        # every run has left its folder final or is being given up: no need to wait long
        end_tree(self.runs + self.procs, grace=2.0)
        self.runs, self.procs = [], []
        shutil.rmtree(self.home, ignore_errors=True)


_shared: SimulationLink | None = None


def shared_link(env: dict[str, str]) -> SimulationLink:
    """This process's SuperLink for runs with ``env``, started (again) when there is none, it
    has died, or the environment changed."""
    global _shared
    if _shared is not None and (_shared.extra != env or not _shared.alive()):
        end_shared_link()
    if _shared is None:
        t0 = time.time()
        _shared = SimulationLink(env).__enter__()
        log.debug("SuperLink (simulation) started in %.1fs", time.time() - t0)
    return _shared


def running_link() -> SimulationLink | None:
    """This process's SuperLink, if one is running."""
    return _shared


def end_shared_link() -> None:
    """End this process's SuperLink and every process of its runs."""
    global _shared
    if _shared is not None:
        link, _shared = _shared, None
        link.__exit__(None, None, None)


atexit.register(end_shared_link)
