"""Flower's deployment runtime on this machine: a SuperLink and N SuperNodes as separate
processes on loopback, optionally over TLS, driven by ``flwr run``.

This is what runs across machines, started on one: the same commands with other addresses
(see the README). Flower's runtime dependency installation stays off; nothing is downloaded.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from plasticlm.errors import PlasticError
from plasticlm.runs import THREADS_ENV
from plasticlm.tls import make_certificates

APP_DIR = Path(__file__).parent / "flower_app"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _wait_port(port: int, seconds: float) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise PlasticError(f"the SuperLink did not open port {port} within {seconds:.0f}s")


def _bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise PlasticError(f"{name} is not installed next to {sys.executable}; install "
                           "flwr[simulation]==1.42.0 (make test does)")
    return str(path)


class LocalFederation:
    """SuperLink + ``nodes`` SuperNodes on 127.0.0.1; ``run(...)`` submits a run with
    ``flwr run`` and waits for it. Use as a context manager; every process is stopped on exit.
    """

    def __init__(self, workdir: str | Path, nodes: int = 2, tls: bool = False):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.nodes, self.tls = nodes, tls
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, FLWR_HOME=str(self.workdir / "flwr_home"),
                        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", PYTHONUNBUFFERED="1",
                        # the processes share this machine's cores: one torch thread each
                        **{THREADS_ENV: "1"},
                        # the SuperLink starts flower-superexec from PATH
                        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")

    def _spawn(self, args: list[str], log: str) -> None:
        out = (self.workdir / log).open("w")
        self.procs.append(subprocess.Popen(args, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True))

    def __enter__(self) -> LocalFederation:
        link, *node_ports = _free_ports(1 + self.nodes)
        self.link = link
        if self.tls:
            certs = make_certificates(self.workdir / "certs")
            link_sec = ["--ssl-ca-certfile", str(certs["ca"]), "--ssl-certfile", str(certs["cert"]),
                        "--ssl-keyfile", str(certs["key"])]
            node_sec = ["--root-certificates", str(certs["ca"])]
            conn = f'root-certificates = "{certs["ca"]}"'
        else:
            link_sec, node_sec, conn = ["--insecure"], ["--insecure"], "insecure = true"
        home = self.workdir / "flwr_home"
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
            f'address = "127.0.0.1:{link}"\n{conn}\n')
        self._spawn([_bin("flower-superlink"), *link_sec, "--host", "127.0.0.1", "--port",
                     str(link), "--disable-runtime-dependency-installation"], "superlink.log")
        _wait_port(link, 60)
        for i, port in enumerate(node_ports):
            self._spawn([_bin("flower-supernode"), *node_sec, "--superlink", f"127.0.0.1:{link}",
                         "--node-config", f"partition-id={i} num-partitions={self.nodes}",
                         "--host", "127.0.0.1", "--port", str(port)], f"supernode{i}.log")
        return self

    def run(self, run_config: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
        """``flwr run`` the plasticlm app with ``run_config`` and wait for it to finish."""
        rc = " ".join(f'{k}="{v}"' for k, v in run_config.items())
        args = [_bin("flwr"), "run", str(APP_DIR), "local", "--stream", "--run-config", rc]
        done = subprocess.run(args, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        (self.workdir / "flwr_run.log").write_text(done.stdout + done.stderr)
        return done

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
