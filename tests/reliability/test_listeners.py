"""Nothing a FedNL run listens on is open to another machine or another local user: every
socket of a ``fednl run`` on loopback, Ray's cluster refusing a driver from another address
(a network namespace) and asking for its token, and a second uid (``setpriv``) refused by
the simulation and the deployment SuperLinks where their owner is let through."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from plasticlm.fednl.deploy.deployment import LocalFederation, make_node_key
from plasticlm.fednl.deploy.processes import APP_DIR, flower_bin
from plasticlm.fednl.deploy.simulation import SimulationLink
from plasticlm.fednl.deploy.submit import operator_env

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
REFUSED = "only the operator"


def sockets_of(root: psutil.Process) -> dict[tuple[str, int], str]:
    """(address, port) -> process name of every listening TCP or bound UDP socket of
    ``root`` and everything it started."""
    procs = {root.pid: root}
    try:
        procs.update((p.pid, p) for p in root.children(recursive=True))
    except psutil.NoSuchProcess:
        return {}
    found = {}
    for c in psutil.net_connections(kind="inet"):
        if c.pid in procs and c.laddr and (c.status == psutil.CONN_LISTEN
                                           or c.type == socket.SOCK_DGRAM):
            try:
                name = procs[c.pid].name()
            except psutil.NoSuchProcess:
                name = "?"
            found[(c.laddr.ip, c.laddr.port)] = name
    return found


def loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


@pytest.mark.slow   # a whole run, 90-150 s on 2 cores: `make test-slow`
def test_every_socket_a_fednl_run_opens_is_on_loopback_and_ray_asks_for_a_token(tmp_path):
    cmd = [sys.executable, "-m", "plasticlm.cli", "fednl", "run", "--quick", "--set",
           "data.max_test=4", "--set", "data.split=dirichlet", "--set", "data.num_clients=2",
           "--set", "train.rounds=2", "--set", f"outputs.out={tmp_path}", "--set", "name=net"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    seen: dict[tuple[str, int], str] = {}
    ray_env: dict[str, str] = {}
    deadline = time.time() + 600
    while proc.poll() is None and time.time() < deadline:
        seen.update(sockets_of(root))
        for p in root.children(recursive=True) if not ray_env else ():
            try:
                if p.name() == "gcs_server":
                    ray_env = dict(p.environ(), cmdline=" ".join(p.cmdline()))
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.2)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0, err[-2000:]
    names = set(seen.values())
    # not vacuous: the SuperLink, Ray's GCS and raylet and the clients' actors were seen
    assert {"gcs_server", "raylet"} <= names and any("ClientAppActor" in n for n in names), seen
    assert any(n.startswith("python") for n in names), seen
    open_ = {f"{ip}:{port}": name for (ip, port), name in seen.items() if not loopback(ip)}
    assert not open_, f"listening beyond loopback: {open_}"
    # Ray's cluster asks for a token made for this run, in the SuperLink's private folder
    assert ray_env["RAY_AUTH_MODE"] == "token", ray_env
    token = Path(ray_env["RAY_AUTH_TOKEN_PATH"])
    assert "--node-ip-address=127.0.0.1" in ray_env["cmdline"]
    assert f"--session-dir={token.parent}/" in ray_env["cmdline"]
    assert not token.exists()    # gone with the run's private folder


def _ip(*args: str, ns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def namespace():
    """A network namespace joined to this one by a veth pair: (namespace, this side's
    address), the namespace's side 10.231.x.2."""
    if os.geteuid() != 0:
        pytest.skip("creating a network namespace needs root")
    if shutil.which("ip") is None:
        pytest.skip("iproute2's ip is not installed (apt-get install iproute2)")
    tag = uuid.uuid4().hex[:6]
    ns, here, there = f"pl{tag}", f"plh{tag}", f"pln{tag}"
    net = 10 + int(tag[:2], 16) % 200
    try:
        _ip("netns", "add", ns)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot create a network namespace here: {e.stderr.decode().strip()}")
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", ns)
        _ip("addr", "add", f"10.231.{net}.1/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("addr", "add", f"10.231.{net}.2/30", "dev", there, ns=ns)
        _ip("link", "set", there, "up", ns=ns)
        _ip("link", "set", "lo", "up", ns=ns)
        yield ns, f"10.231.{net}.1"
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30)


# Holds a Ray cluster started as flwr-simulation starts it (ray.init, no dashboard) until
# stdin closes; prints the GCS address.
HOLD_RAY = """
import os, sys, ray
ray.init(include_dashboard=False, num_cpus=1, logging_level="ERROR", log_to_driver=False)
@ray.remote
class Client:
    def pid(self):
        return os.getpid()
client = Client.remote()
ray.get(client.pid.remote())
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
"""
# A stranger's driver: joins the cluster at argv[1] and runs a task on it.
DRIVER = """
import os, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
@ray.remote
def pid():
    return os.getpid()
print("RAN", ray.get(pid.remote()), flush=True)
"""
# What a refused driver says: no connection, or the token Ray asks for
NO_ENTRY = ("ConnectionError", "AuthenticationError")


def _driver(address: str, env: dict, ns: str | None = None) -> subprocess.CompletedProcess:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    return subprocess.run([*prefix, sys.executable, "-c", DRIVER, address], env=env,
                          capture_output=True, text=True, timeout=120)


def _reaches(ns: str, host: str, port: int) -> bool:
    probe = (f"import socket; s = socket.socket(); s.settimeout(3); "
             f"raise SystemExit(s.connect_ex(({host!r}, {port})))")
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", probe],
                          capture_output=True, timeout=30).returncode == 0


@pytest.mark.slow   # a Ray cluster and drivers in another network namespace, 20-50 s
def test_a_ray_driver_from_another_address_is_refused_and_one_without_the_token_too(
        namespace, tmp_path):
    ns, host = namespace
    link = SimulationLink({})       # its environment is the one Flower's Ray starts in
    home = tmp_path / "stranger"
    home.mkdir()
    stranger = {k: v for k, v in link.env.items() if not k.startswith("RAY_AUTH")}
    # the stranger has no token of its own and gives up on a closed door after one try
    stranger.update(HOME=str(home), RAY_NUM_REDIS_GET_RETRIES="1", RAY_TMPDIR=str(home),
                    RAY_py_gcs_connect_timeout_s="5")
    ray = subprocess.Popen([sys.executable, "-c", HOLD_RAY], env=link.env, text=True,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL)
    try:
        gcs = ray.stdout.readline().strip()
        assert gcs, "the Ray cluster did not start"
        port = int(gcs.rpartition(":")[2])
        ports = sorted(p for (_, p) in sockets_of(psutil.Process(ray.pid)))
        assert port in ports and len(ports) >= 4
        # the namespace reaches this side: a socket on every interface answers it
        with socket.create_server(("0.0.0.0", 0)) as control:
            assert _reaches(ns, host, control.getsockname()[1])
        reached = [p for p in ports if _reaches(ns, host, p)]
        assert reached == [], f"Ray ports reachable from another address: {reached}"
        far = _driver(f"{host}:{port}", stranger, ns)
        assert "RAN" not in far.stdout and any(w in far.stderr for w in NO_ENTRY), far.stderr
        # on this machine's loopback, a driver without the token is refused; with it, it runs
        near = _driver(gcs, stranger)
        assert "RAN" not in near.stdout and any(w in near.stderr for w in NO_ENTRY), near.stderr
        own = _driver(gcs, dict(link.env, RAY_NUM_REDIS_GET_RETRIES="3"))
        assert "RAN" in own.stdout, own.stdout + own.stderr[-800:]
    finally:
        ray.stdin.close()
        try:
            ray.wait(timeout=30)
        except subprocess.TimeoutExpired:
            ray.kill()
        shutil.rmtree(link.home, ignore_errors=True)


def _stranger_home(address: str, ca: Path | None = None) -> Path:
    """A FLWR_HOME the second uid may use, with one connection ``x`` to ``address``."""
    home = Path(tempfile.mkdtemp(prefix="plnobody-"))
    conn = "insecure = true"
    if ca is not None:
        shutil.copy(ca, home / "ca.pem")
        conn = f'root-certificates = "{home / "ca.pem"}"'
    (home / "config.toml").write_text(f'[superlink]\ndefault = "x"\n\n[superlink.x]\n'
                                      f'address = "{address}"\n{conn}\n')
    for p in [home, *home.iterdir()]:
        p.chmod(0o777 if p.is_dir() else 0o644)
    return home


def _flwr(env: dict, home: Path, *args: str, uid: list[str] = (), conn: str = "x") -> str:
    done = subprocess.run([*uid, flower_bin("flwr"), *args, conn, "--format", "json"],
                          env=dict(env, FLWR_HOME=str(home), HOME=str(home)),
                          capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


def _strangers_three_tries(env: dict, home: Path, public_key: Path) -> list[str]:
    """list runs, start a run, register a node: what the second uid got for each."""
    key = Path(shutil.copy(public_key, home / "node.pub"))
    key.chmod(0o644)
    return [_flwr(env, home, *args, uid=NOBODY) for args in
            (["ls"], ["run", str(APP_DIR)], ["supernode", "register", str(key)])]


@pytest.fixture
def second_uid():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("acting as a second uid needs root and setpriv (util-linux)")


@pytest.mark.slow   # two SuperLinks and a dozen flwr commands, 20-40 s
def test_a_second_local_user_is_refused_by_both_superlinks_and_the_owner_is_not(
        second_uid, tmp_path, monkeypatch):
    public = tmp_path / "keys" / "node.pub"
    make_node_key(tmp_path / "keys" / "node")
    homes = []
    try:
        with SimulationLink({}) as link:
            address = (link.home / "config.toml").read_text().split('address = "')[1]
            address = address.split('"')[0]
            home = _stranger_home(address)
            homes.append(home)
            for args, said in zip(["ls", "run", "register"],
                                  _strangers_three_tries(link.env, home, public), strict=True):
                assert REFUSED in said, (args, said[-500:])
            # the owner, without the secret: its uid on loopback
            owner = _stranger_home(address)
            homes.append(owner)
            assert '"success": true' in _flwr(link.env, owner, "ls")
            # the second uid holding the secret is the operator: flwr sends it from the
            # private FLWR_HOME plasticlm's submit makes (`fednl submit --operator-secret-file`)
            secret = home / "operator.secret"
            shutil.copy(link.secret, secret)
            os.chown(secret, 65534, 65534)
            monkeypatch.setenv("FLWR_HOME", str(home))
            with operator_env("x", secret) as env:
                private = Path(env["FLWR_HOME"])
                for p in [private, *private.iterdir()]:
                    os.chown(p, 65534, 65534)
                assert '"success": true' in _flwr(env, private, "ls", uid=NOBODY)
            assert not private.exists() and not (home / "credentials.yaml").exists()
        with LocalFederation(tmp_path / "fed", nodes=0, tls=True, auth=True) as fed:
            home = _stranger_home(fed.address(), fed.certs["ca"])
            homes.append(home)
            for args, said in zip(["ls", "run", "register"],
                                  _strangers_three_tries(fed.env, home, public), strict=True):
                assert REFUSED in said, (args, said[-500:])
            assert fed.registered_nodes() == []
            listed = _flwr(fed.env, fed.workdir / "flwr_home", "ls", conn="local")
            assert '"success": true' in listed and '"runs": []' in listed, listed
    finally:
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)
