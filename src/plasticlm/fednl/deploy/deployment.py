"""Flower's deployment runtime on this machine: a SuperLink and N SuperNodes as separate
processes, optionally over TLS, driven by ``flwr run``.

This is what runs across machines, started on one: the same commands with other addresses
(see docs/fednl.md). The SuperLink is plasticlm's (:mod:`plasticlm.fednl.deploy.superlink`):
Flower's app behind the operator gate, so only this user (its uid on loopback) or the holder
of the operator secret reaches the Control and runtime routes. Flower's runtime dependency installation is on, as Flower
ships it: the app declares no dependencies (they are this environment's), so nothing is
installed or downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import tomli_w

from plasticlm.env import THREADS_ENV
from plasticlm.errors import PlasticError
from plasticlm.fednl.deploy.processes import (
    APP_DIR,
    end_tree,
    flower_bin,
    flower_env,
    free_ports,
    spawn,
    wait_port,
)
from plasticlm.fednl.deploy.superlink import make_operator_secret, operator_client
from plasticlm.tls import make_certificates


def make_node_key(out: str | Path) -> tuple[Path, Path]:
    """A SuperNode's authentication key pair (ECDSA P-384, OpenSSH format, as Flower expects):
    ``out`` (private, created 0600) and ``out.pub`` (what ``flwr supernode register`` takes)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    out.unlink(missing_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                  serialization.NoEncryption()))
    pub = out.with_suffix(".pub")
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                  serialization.PublicFormat.OpenSSH))
    return out, pub


class LocalFederation:
    """SuperLink + ``nodes`` SuperNodes on this machine; ``run(...)`` submits a run with
    ``flwr run`` and waits for it. Use as a context manager; every process is stopped on exit.

    The SuperLink listens on ``host`` (default 127.0.0.1; another address of this machine to
    be reached from the network, when it also listens on 127.0.0.1) behind the operator
    gate: the SuperNodes reach its Fleet routes through ``host``; ``flwr`` (``run``,
    ``register``, ``registered_nodes``) works as the operator because it runs as the
    SuperLink's own user on loopback; ``operator_secret`` (0600) lets the operator in as
    another user or from elsewhere (:func:`operator_client`, or ``flwr`` itself after
    :func:`~plasticlm.fednl.deploy.superlink.store_operator_secret`).

    ``auth=True`` (needs ``tls``) turns on SuperNode authentication: each node gets a key pair,
    its public key is registered with ``flwr supernode register`` before it starts, and the
    SuperLink refuses any node whose key is not registered.
    """

    def __init__(self, workdir: str | Path, nodes: int = 2, tls: bool = False,
                 auth: bool = False, host: str = "127.0.0.1"):
        if auth and not tls:
            raise PlasticError("SuperNode authentication needs TLS: LocalFederation(tls=True, "
                               "auth=True)")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.nodes, self.tls, self.auth, self.host = nodes, tls, auth, host
        self.procs: list[subprocess.Popen] = []
        self.operator_secret = make_operator_secret(self.workdir / "operator.secret")
        # the processes share this machine's cores: one torch thread each
        self.env = flower_env(self.workdir / "flwr_home", **{THREADS_ENV: "1"})

    def _spawn(self, args: list[str], log: str) -> None:
        self.procs.append(spawn(args, self.env, self.workdir / log, new_session=True))

    def address(self, host: str | None = None) -> str:
        """host:port of the SuperLink (``host`` default: the address it was bound to; a
        wildcard binding is reached on 127.0.0.1)."""
        host = host or self.host
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        return f"[{host}]:{self.link}" if ":" in host else f"{host}:{self.link}"

    def __enter__(self) -> LocalFederation:
        link, *node_ports = free_ports(1 + self.nodes)
        self.link = link
        if self.tls:
            hosts = tuple(dict.fromkeys(("127.0.0.1", "localhost", self.host)))
            self.certs = make_certificates(self.workdir / "certs", hosts=hosts)
            link_sec = ["--ssl-ca-certfile", str(self.certs["ca"]), "--ssl-certfile",
                        str(self.certs["cert"]), "--ssl-keyfile", str(self.certs["key"])]
            node_sec = ["--root-certificates", str(self.certs["ca"])]
            conn = f'root-certificates = "{self.certs["ca"]}"'
        else:
            link_sec, node_sec, conn = ["--insecure"], ["--insecure"], "insecure = true"
        home = self.workdir / "flwr_home"
        home.mkdir(exist_ok=True)
        # the operator's connection: loopback, where the gate knows this user by its uid
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
            f'address = "{self.address("127.0.0.1")}"\n{conn}\n')
        self.node_sec = node_sec
        self._spawn([sys.executable, "-m", "plasticlm.fednl.deploy.superlink", "--operator-secret-file",
                     str(self.operator_secret), *link_sec, "--host", self.host, "--port",
                     str(link),
                     *(["--enable-supernode-auth"] if self.auth else [])], "superlink.log")
        wait_port(link, 60, self.procs[-1], self.workdir / "superlink.log")
        for i, port in enumerate(node_ports):
            key = []
            if self.auth:
                private, public = make_node_key(self.workdir / "keys" / f"node{i}")
                self.register(public)
                key = ["--auth-supernode-private-key", str(private)]
            self.start_node(i, port, key)
        return self

    def register(self, public_key: Path) -> None:
        """``flwr supernode register`` a node's public key with the SuperLink."""
        done = subprocess.run([flower_bin("flwr"), "supernode", "register", str(public_key), "local"],
                              env=self.env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise PlasticError(f"flwr supernode register {public_key} failed: "
                               f"{(done.stdout + done.stderr).strip()[-300:]}")

    def start_node(self, index: int, port: int, extra: list[str] = (),
                   log: str | None = None) -> subprocess.Popen:
        """Start a SuperNode for partition ``index`` on ``port`` (``extra``: more flags)."""
        self._spawn([flower_bin("flower-supernode"), *self.node_sec, "--superlink",
                     self.address(), "--node-config",
                     f"partition-id={index} num-partitions={self.nodes}", "--host", "127.0.0.1",
                     "--port", str(port), *extra], log or f"supernode{index}.log")
        return self.procs[-1]

    def operator_client(self, host: str | None = None):
        """Flower's Control API client that sends the operator secret, connecting to
        ``host`` (default: the bound address) over TLS."""
        if not self.tls:
            raise PlasticError("the operator secret travels only over TLS: "
                               "LocalFederation(tls=True)")
        return operator_client(self.address(host), self.certs["ca"], self.operator_secret)

    def registered_nodes(self) -> list[dict]:
        """The SuperLink's nodes (``flwr supernode list``): id and status of each."""
        done = subprocess.run([flower_bin("flwr"), "supernode", "list", "local", "--format", "json"],
                              env=self.env, capture_output=True, text=True, timeout=60)
        return json.loads(done.stdout).get("nodes", []) if done.returncode == 0 else []

    def run(self, run_config: dict, timeout: float = 900) -> subprocess.CompletedProcess:
        """``flwr run`` the plasticlm app with ``run_config`` (FedNLConfig's keys as nested
        tables, :func:`plasticlm.fednl.config.app_config`) and wait for it to finish."""
        path = self.workdir / f"run-config-{time.time_ns()}.toml"
        path.write_text(tomli_w.dumps(run_config))
        args = [flower_bin("flwr"), "run", str(APP_DIR), "local", "--stream", "--run-config",
                str(path)]
        done = subprocess.run(args, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        (self.workdir / "flwr_run.log").write_text(done.stdout + done.stderr)
        return done

    def __exit__(self, *exc) -> None:
        end_tree(self.procs, grace=10.0)
