"""Flower's deployment runtime on this machine: a SuperLink and N SuperNodes as separate
processes on loopback, optionally over TLS, driven by ``flwr run``.

This is what runs across machines, started on one: the same commands with other addresses
(see the README). Flower's runtime dependency installation stays off; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import tomli_w

from plasticlm.env import THREADS_ENV
from plasticlm.errors import PlasticError
from plasticlm.fednl.processes import (
    APP_DIR,
    end_tree,
    flower_bin,
    flower_env,
    free_ports,
    spawn,
    wait_port,
)
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
    """SuperLink + ``nodes`` SuperNodes on 127.0.0.1; ``run(...)`` submits a run with
    ``flwr run`` and waits for it. Use as a context manager; every process is stopped on exit.

    ``auth=True`` (needs ``tls``) turns on SuperNode authentication: each node gets a key pair,
    its public key is registered with ``flwr supernode register`` before it starts, and the
    SuperLink refuses any node whose key is not registered.
    """

    def __init__(self, workdir: str | Path, nodes: int = 2, tls: bool = False,
                 auth: bool = False):
        if auth and not tls:
            raise PlasticError("SuperNode authentication needs TLS: LocalFederation(tls=True, "
                               "auth=True)")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.nodes, self.tls, self.auth = nodes, tls, auth
        self.procs: list[subprocess.Popen] = []
        # the processes share this machine's cores: one torch thread each
        self.env = flower_env(self.workdir / "flwr_home", **{THREADS_ENV: "1"})

    def _spawn(self, args: list[str], log: str) -> None:
        self.procs.append(spawn(args, self.env, self.workdir / log, new_session=True))

    def __enter__(self) -> LocalFederation:
        link, *node_ports = free_ports(1 + self.nodes)
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
        self.node_sec = node_sec
        self._spawn([flower_bin("flower-superlink"), *link_sec, "--host", "127.0.0.1", "--port",
                     str(link), "--disable-runtime-dependency-installation",
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
                     f"127.0.0.1:{self.link}", "--node-config",
                     f"partition-id={index} num-partitions={self.nodes}", "--host", "127.0.0.1",
                     "--port", str(port), *extra], log or f"supernode{index}.log")
        return self.procs[-1]

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
