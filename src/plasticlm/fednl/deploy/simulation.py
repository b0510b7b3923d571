"""Flower's simulation runtime, the way Flower runs it: a SuperLink in simulation mode on
127.0.0.1 and the plasticlm Flower app submitted to it with ``flwr run``.

One SuperLink serves every run of a process (an experiment runs many), started at the first
run and ended when the process exits. Its processes (the SuperLink, each run's simulation
with Ray and the clients) are this process's children: they end with it.

Nothing it starts is open to another user or machine. The SuperLink is plasticlm's
(:mod:`plasticlm.fednl.deploy.superlink`): its Control and runtime routes answer only this user
(its uid on loopback) or the holder of the operator secret in its private FLWR_HOME. Ray
(started by Flower's ``flwr-simulation``, which takes no address for it) is set up through
its environment (:func:`ray_env`): every Ray process binds 127.0.0.1, asks for a token made
for this SuperLink, and keeps its sockets and files in the same private folder.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import tomli_w

from plasticlm.fednl.deploy.processes import (
    APP_DIR,
    descendants,
    end_tree,
    flower_bin,
    flower_env,
    free_ports,
    spawn,
    wait_port,
)
from plasticlm.fednl.deploy.superlink import make_operator_secret, store_operator_secret

log = logging.getLogger("plasticlm.fednl")
CONNECTION = "simulation"
# Flower's Ray logs say nothing a run's user needs; the clients' own errors reach the server.
# Ray's usage statistics (on by default, sent to Ray's servers) stay off: a run sends nothing.
RAY_ENV = {"RAY_DEDUP_LOGS": "0", "RAY_DISABLE_IMPORT_WARNING": "1",
           "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0", "RAY_USAGE_STATS_ENABLED": "0"}
# What would point Ray elsewhere than the cluster a run starts, or at another token
RAY_UNSET = ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_TMPDIR")


def ray_env(home: Path) -> dict[str, str]:
    """The environment that keeps a run's Ray cluster private, with a new token in
    ``home/ray_token`` (0600):

    - ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: Ray's single-machine mode (its default on
      Windows and macOS): the node's address is 127.0.0.1, so the GCS, raylets, workers and
      agents bind 127.0.0.1 (Ray 2.55 binds its gRPC servers to every interface otherwise);
    - ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH``: every Ray RPC carries the token;
    - ``RAY_TMPDIR=home``: Ray's session folder (its Unix sockets, logs, spilled objects)
      inside this private folder instead of the world-writable /tmp/ray.
    """
    token = home / "ray_token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token), "RAY_TMPDIR": str(home)}


class SimulationLink:
    """A SuperLink in simulation mode on a free loopback port with its own FLWR_HOME (0700,
    holding the operator secret and Ray's token and session), behind the operator gate.

    ``submit`` starts ``flwr run`` of the plasticlm app on it (its logs streamed to a file)
    and returns the ``flwr run`` process; a run ends when that process does. ``env`` is the
    environment every run's processes get (the thread policy, the device and dtype).
    """

    def __init__(self, env: dict[str, str]):
        self.extra = dict(env)
        # 0700; short, as Ray's Unix socket paths inside it must stay under 108 bytes
        self.home = Path(tempfile.mkdtemp(prefix="plflwr-", dir="/tmp" if os.name == "posix"
                                          else None))
        self.env = flower_env(self.home, **RAY_ENV, **self.extra)
        for name in RAY_UNSET:
            self.env.pop(name, None)
        self.env.update(ray_env(self.home))
        self.secret = make_operator_secret(self.home / "operator.secret")
        self.procs: list[subprocess.Popen] = []
        self.runs: list[subprocess.Popen] = []

    def __enter__(self) -> SimulationLink:
        (port,) = free_ports(1)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{port}"\ninsecure = true\n')
        # plasticlm's own flwr calls carry the secret too (where no socket owner is known)
        store_operator_secret(self.home, f"127.0.0.1:{port}", self.secret)
        logfile = self.home / "superlink.log"
        self.procs.append(spawn([sys.executable, "-m", "plasticlm.fednl.deploy.superlink",
                                 "--operator-secret-file", str(self.secret), "--insecure",
                                 "--simulation", "--isolation", "subprocess", "--host",
                                 "127.0.0.1", "--port", str(port)],
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
