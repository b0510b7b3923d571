"""Only the operator commands a FedNL deployment: the operator gate in front of Flower's
SuperLink (plasticlm.fednl.deploy.superlink) on its own, the socket owner lookup it trusts on
loopback (plasticlm.fednl.deploy.peer_uid), then a LocalFederation bound to a non-loopback address
of this machine, probed by a stranger holding the CA certificate."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from flwr.cli.supernode.register import try_load_public_key
from flwr.proto.control_pb2 import (  # pylint: disable=E0611
    ListRunsRequest,
    RegisterNodeRequest,
    StartRunRequest,
)

from plasticlm.errors import PlasticError
from plasticlm.fednl.deploy.processes import APP_DIR, flower_bin
from plasticlm.fednl.deploy.superlink import (
    OPERATOR_HEADER,
    OperatorGate,
    make_operator_secret,
    read_operator_secret,
)

SECRET = b"s" * 40


class Inner:
    """A tiny ASGI app that records what reached it and reads the body when it runs."""

    def __init__(self):
        self.calls = []

    async def __call__(self, scope, receive, send):
        self.calls.append(scope)
        if scope["type"] == "http":
            await receive()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})


def call(gate: OperatorGate, path: str, client=("192.0.2.9", 5000), scheme="https",
         headers=(), kind="http", server=("127.0.0.1", 9093)):
    """(messages sent, whether the body was read) for one request through ``gate``."""
    sent, reads = [], []

    async def receive():
        reads.append(1)
        return {"type": "http.request", "body": b"x" * 10, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": kind, "path": path, "method": "POST", "scheme": scheme, "client": client,
             "server": server, "headers": list(headers)}
    asyncio.run(gate(scope, receive, send))
    return sent, bool(reads)


def status(sent) -> int | None:
    return next((m["status"] for m in sent if m["type"] == "http.response.start"), None)


CONTROL = ["/v1/control/register-node", "/v1/control/start-run", "/v1/control/list-runs",
           "/v1/runtime/get-nodes", "/v1/runtime/pull-messages", "/docs", "/openapi.json", "/",
           "/v1/fleet/../control/start-run", "/v1/fleet/x/../../control/list-runs",
           "/v1/fleet/", "/v1/fleetx/start-run", "/v1/fleet/Get-Run", "//v1/control/list-runs"]


@pytest.mark.parametrize("path", CONTROL)
def test_the_gate_refuses_a_stranger_every_route_but_the_fleet_before_reading(path):
    inner = Inner()
    sent, read = call(OperatorGate(inner, SECRET), path)
    assert status(sent) == 403 and not read and inner.calls == []


@pytest.mark.parametrize("path", ["/v1/fleet/register-node", "/v1/fleet/pull-messages",
                                  "/v1/fleet/get-fab", "/health"])
def test_the_gate_lets_anyone_reach_the_fleet_routes_and_health(path):
    inner = Inner()
    sent, read = call(OperatorGate(inner, SECRET), path)
    assert status(sent) == 200 and read and len(inner.calls) == 1


OWNER, OTHER = 1000, 1001


def gate_with_uids(uid_of_peer: int | None, secret=None, inner=None, known=True) -> OperatorGate:
    """A gate owned by OWNER whose socket lookup finds ``uid_of_peer`` for any peer."""
    return OperatorGate(inner or Inner(), secret, owner_uid=OWNER, uids_known=known,
                        uid_of=lambda client, server: uid_of_peer)


@pytest.mark.parametrize("peer", ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"])
def test_the_gate_lets_the_owners_uid_through_from_loopback_as_the_operator(peer):
    sent, _ = call(gate_with_uids(OWNER), "/v1/control/start-run", client=(peer, 1))
    assert status(sent) == 200


@pytest.mark.parametrize("uid", [OTHER, 0, None])
@pytest.mark.parametrize("path", ["/v1/control/list-runs", "/v1/control/start-run",
                                  "/v1/control/register-node", "/v1/runtime/pull-messages"])
def test_loopback_alone_is_no_operator_another_uid_or_an_unknown_socket_is_refused(uid, path):
    inner = Inner()
    sent, read = call(gate_with_uids(uid, SECRET, inner), path, client=("127.0.0.1", 1))
    assert status(sent) == 403 and not read and inner.calls == []


def test_the_owners_uid_counts_only_on_loopback():
    sent, _ = call(gate_with_uids(OWNER), "/v1/control/list-runs", client=("10.0.0.1", 1))
    assert status(sent) == 403


def test_where_no_socket_owner_is_listed_loopback_stays_the_operator():
    assert status(call(gate_with_uids(None, known=False), "/v1/control/list-runs",
                       client=("127.0.0.1", 1))[0]) == 200
    assert status(call(gate_with_uids(None, known=False), "/v1/control/list-runs")[0]) == 403


@pytest.mark.parametrize("peer", [None, ("10.0.0.1", 1), ("::ffff:10.0.0.1", 1),
                                  ("localhost", 1), ("", 1)])
def test_the_gate_treats_any_other_peer_as_a_stranger(peer):
    sent, _ = call(gate_with_uids(OWNER), "/v1/control/list-runs", client=peer)
    assert status(sent) == 403


def test_the_operator_secret_opens_the_control_routes_over_tls_or_loopback_and_exactly():
    gate = gate_with_uids(OTHER, SECRET)
    good = [(OPERATOR_HEADER.encode(), SECRET)]
    bearer = [(b"authorization", b"Bearer " + SECRET)]       # as flwr sends a stored token
    assert status(call(gate, "/v1/control/start-run", headers=good)[0]) == 200
    assert status(call(gate, "/v1/control/start-run", headers=bearer)[0]) == 200
    # in the clear only from loopback, where no other unprivileged user can read it
    assert status(call(gate, "/v1/control/start-run", headers=good, scheme="http")[0]) == 403
    assert status(call(gate, "/v1/control/start-run", headers=bearer, scheme="http",
                       client=("127.0.0.1", 1))[0]) == 200
    for bad in ([(OPERATOR_HEADER.encode(), SECRET[:-1])],
                [(OPERATOR_HEADER.encode(), SECRET + b"x")],
                [(OPERATOR_HEADER.encode(), b"")],
                [(b"authorization", b"Basic " + SECRET)],
                [(b"authorization", b"Bearer")],
                good + good,                      # two values: ambiguous, refused
                good + bearer):
        for client in (("192.0.2.9", 1), ("127.0.0.1", 1)):
            assert status(call(gate, "/v1/control/start-run", headers=bad,
                               client=client)[0]) == 403, (bad, client)
    # no secret configured: a header proves nothing
    assert status(call(gate_with_uids(OTHER), "/v1/control/start-run", headers=good)[0]) == 403


def test_the_secret_never_reaches_flowers_app_and_the_fleets_headers_pass_untouched():
    inner = Inner()
    gate = gate_with_uids(OTHER, SECRET, inner)
    call(gate, "/v1/control/list-runs", headers=[(OPERATOR_HEADER.encode(), SECRET),
                                                 (b"x-other", b"1")])
    call(gate, "/v1/control/list-runs", headers=[(b"authorization", b"Bearer " + SECRET)])
    assert [c["headers"] for c in inner.calls] == [[(b"x-other", b"1")], []]
    call(gate, "/v1/fleet/pull-messages", headers=[(b"authorization", b"x")])
    assert inner.calls[-1]["headers"] == [(b"authorization", b"x")]


def test_the_gate_closes_a_strangers_websocket_and_passes_lifespan():
    inner = Inner()
    gate = OperatorGate(inner, SECRET)
    sent, _ = call(gate, "/v1/control/stream-logs", kind="websocket")
    assert sent == [{"type": "websocket.close", "code": 1008}] and inner.calls == []
    call(gate, "", client=None, kind="lifespan")
    assert [s["type"] for s in inner.calls] == ["lifespan"]


def test_the_operator_secret_file_is_private_and_long(tmp_path):
    path = make_operator_secret(tmp_path / "op" / "operator.secret")
    assert path.stat().st_mode & 0o777 == 0o600
    assert len(read_operator_secret(path)) >= 32
    path.chmod(0o644)
    with pytest.raises(PlasticError, match="readable by others"):
        read_operator_secret(path)
    path.chmod(0o600)
    path.write_text("short\n")
    with pytest.raises(PlasticError, match="characters"):
        read_operator_secret(path)
    with pytest.raises(PlasticError, match="characters"):
        OperatorGate(Inner(), b"short")


def _public_address() -> str | None:
    """An IPv4 address of this machine other than loopback and link-local, that binds."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family != socket.AF_INET:
                continue
            ip = ipaddress.ip_address(a.address)
            if ip.is_loopback or ip.is_link_local:
                continue
            with socket.socket() as s:
                try:
                    s.bind((a.address, 0))
                except OSError:
                    continue
            return a.address
    return None


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """A TLS federation with node authentication and no nodes, bound to a non-loopback
    address of this machine."""
    from plasticlm.fednl.deploy.deployment import LocalFederation

    host = _public_address()
    if host is None:
        pytest.skip("this machine has no non-loopback IPv4 address to bind the SuperLink to")
    with LocalFederation(tmp_path_factory.mktemp("fed"), nodes=0, tls=True, auth=True,
                         host=host) as fed:
        yield fed


def _stranger(fed, path: str, body: bytes) -> httpx.Response:
    """A POST from the non-loopback address, over TLS with the CA certificate, as Flower's
    own client sends it."""
    with httpx.Client(verify=str(fed.certs["ca"]), timeout=20) as client:
        return client.post(f"https://{fed.address()}{path}", content=body,
                           headers={"content-type": "application/protobuf",
                                    "accept": "application/protobuf"})


def test_a_stranger_with_the_ca_certificate_can_neither_register_nor_run_nor_list(
        federation, tmp_path):
    from plasticlm.fednl.deploy.deployment import make_node_key

    fed = federation
    _, public = make_node_key(tmp_path / "stranger")
    for path, request in [("/v1/control/register-node",
                           RegisterNodeRequest(public_key=try_load_public_key(public))),
                          ("/v1/control/start-run", StartRunRequest()),
                          ("/v1/control/list-runs", ListRunsRequest())]:
        answer = _stranger(fed, path, request.SerializeToString())
        assert answer.status_code == 403, (path, answer.status_code, answer.text[:200])
    # the Fleet routes stay open to it: Flower's node authentication answers there
    assert _stranger(fed, "/v1/fleet/get-run", b"").status_code != 403
    # the same as the stranger did it: flwr with a connection to the public address
    home = tmp_path / "stranger_home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "x"\n\n[superlink.x]\naddress = "{fed.address()}"\n'
        f'root-certificates = "{fed.certs["ca"]}"\n')
    for args in (["supernode", "register", str(public)], ["run", str(APP_DIR)], ["ls"]):
        done = subprocess.run([flower_bin("flwr"), *args, "x"],
                              env=dict(fed.env, FLWR_HOME=str(home)), capture_output=True,
                              text=True, timeout=60)
        assert done.returncode != 0 and "only the operator" in done.stdout + done.stderr, args
    # nothing got in: the operator (loopback) sees no node and no run
    assert fed.registered_nodes() == []
    with fed.operator_client("127.0.0.1") as client:
        assert list(client.ListRuns(ListRunsRequest()).run_dict) == []


def _flwr(fed, *args: str) -> subprocess.CompletedProcess:
    """``flwr ARGS local --format json`` as the operator: the SuperLink's uid on loopback."""
    return subprocess.run([flower_bin("flwr"), *args, "local", "--format", "json"],
                          env=fed.env, capture_output=True, text=True, timeout=60)


def test_the_operator_registers_submits_and_lists_from_loopback_and_with_the_secret(
        federation, tmp_path):
    from plasticlm.fednl.deploy.deployment import make_node_key

    fed = federation
    _, public = make_node_key(tmp_path / "operator_node")
    fed.register(public)                                   # flwr supernode register, loopback
    assert len(fed.registered_nodes()) == 1
    started = _flwr(fed, "run", str(APP_DIR))              # a run waiting for nodes
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = int(json.loads(started.stdout)["run-id"])
    listed = _flwr(fed, "ls")
    assert listed.returncode == 0 and [int(r["run-id"]) for r in json.loads(listed.stdout)["runs"]] \
        == [run_id], listed.stdout + listed.stderr
    with fed.operator_client() as client:     # from the non-loopback address, secret sent
        assert list(client.ListRuns(ListRunsRequest()).run_dict) == [run_id]
    assert _flwr(fed, "stop", str(run_id)).returncode == 0
    assert _stranger(fed, "/v1/control/list-runs",
                     ListRunsRequest().SerializeToString()).status_code == 403


def test_peer_uid_names_the_owner_of_a_loopback_connections_client_socket():
    """The client end of a live loopback connection is found with its uid: this process's."""
    from plasticlm.fednl.deploy.peer_uid import AVAILABLE, peer_uid

    if not AVAILABLE:
        pytest.skip("this system lists no socket owners (/proc/net/tcp)")
    with socket.create_server(("127.0.0.1", 0)) as server:
        addr = server.getsockname()
        with socket.create_connection(addr) as client:
            accepted, peer = server.accept()
            with accepted:
                assert client.getsockname() == peer
                assert peer_uid(peer, addr) == os.geteuid()
                assert peer_uid(("::ffff:" + peer[0], peer[1]), addr) == os.geteuid()
                assert peer_uid(peer, ("127.0.0.1", addr[1] + 1)) is None   # not this pair


@pytest.mark.slow   # a second process (under a second uid): `make test-slow`
def test_peer_uid_names_a_second_users_socket_as_that_users():
    from plasticlm.fednl.deploy.peer_uid import AVAILABLE, peer_uid

    if not AVAILABLE or os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs /proc/net/tcp, root and setpriv to act as a second uid")
    with socket.create_server(("127.0.0.1", 0)) as server:
        addr = server.getsockname()
        hold = (f"import socket, sys; s = socket.create_connection(('127.0.0.1', {addr[1]})); "
                "print(s.getsockname()[1], flush=True); sys.stdin.read()")
        child = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                  sys.executable, "-c", hold], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            accepted, peer = server.accept()
            with accepted:
                assert int(child.stdout.readline()) == peer[1]
                assert peer_uid(peer, addr) == 65534
        finally:
            child.stdin.close()
            child.wait(timeout=30)


def test_peer_uid_reads_the_kernels_ipv4_ipv6_and_mapped_addresses(tmp_path):
    from plasticlm.fednl.deploy.peer_uid import peer_uid

    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
    v4 = tmp_path / "tcp"
    v4.write_text(head +   # 127.0.0.1:40000 -> 127.0.0.1:8080, established, then TIME_WAIT
                  "   0: 0100007F:9C40 0100007F:1F90 01 0:0 00:0 0  1234 0 1\n"
                  "   1: 0100007F:9C41 0100007F:1F90 06 0:0 00:0 0     0 0 0\n"
                  # a client that sent its request and closed: FIN_WAIT2, uid 0, inode 0
                  "   2: 0100007F:9C44 0100007F:1F90 05 0:0 00:0 0     0 0 0\n")
    v6 = tmp_path / "tcp6"
    v6.write_text(head +   # [::1]:40002 -> [::1]:8080; ::ffff:127.0.0.1:40003 -> same
                  "   0: 00000000000000000000000001000000:9C42 "
                  "00000000000000000000000001000000:1F90 01 0:0 00:0 0  4321 0 1\n"
                  "   1: 0000000000000000FFFF00000100007F:9C43 "
                  "0000000000000000FFFF00000100007F:1F90 01 0:0 00:0 0  77 0 1\n")
    tables = (v4, v6)
    assert peer_uid(("127.0.0.1", 40000), ("127.0.0.1", 8080), tables) == 1234
    assert peer_uid(("127.0.0.1", 40001), ("127.0.0.1", 8080), tables) is None  # TIME_WAIT
    assert peer_uid(("127.0.0.1", 40004), ("127.0.0.1", 8080), tables) is None  # FIN_WAIT2
    assert peer_uid(("::1", 40002), ("::1", 8080), tables) == 4321
    assert peer_uid(("127.0.0.1", 40003), ("127.0.0.1", 8080), tables) == 77
    assert peer_uid(("127.0.0.1", 40000), ("127.0.0.1", 8081), tables) is None
    assert peer_uid(("localhost", 40000), ("127.0.0.1", 8080), tables) is None


def test_submit_sends_the_secret_from_a_private_copy_of_flwr_home_as_flwrs_own_token(
        tmp_path, monkeypatch):
    """``fednl submit --operator-secret-file``: flwr runs with a 0700 copy of the caller's
    FLWR_HOME whose stored access token for the connection's address is the secret (what
    Flower's CLI sends as ``Authorization: Bearer``); the caller's FLWR_HOME is untouched."""
    from flwr.cli.auth_plugin import OidcCliPlugin
    from flwr.common.constant import ACCESS_TOKEN_KEY
    from flwr.supercore.credential_store.file_credential_store import FileCredentialStore

    from plasticlm.fednl.deploy.submit import operator_env

    home = tmp_path / "flwr"
    home.mkdir()
    config = '[superlink]\ndefault = "x"\n\n[superlink.x]\naddress = "10.0.0.1:9093"\n'
    (home / "config.toml").write_text(config)
    monkeypatch.setenv("FLWR_HOME", str(home))
    secret = make_operator_secret(tmp_path / "operator.secret")
    with operator_env("x") as env:
        assert env["FLWR_HOME"] == str(home)
    with operator_env("x", secret) as env:
        private = Path(env["FLWR_HOME"])
        assert private != home and private.stat().st_mode & 0o777 == 0o700
        assert (private / "config.toml").read_text() == config
        assert (private / "credentials.yaml").stat().st_mode & 0o077 == 0
        plugin = OidcCliPlugin("10.0.0.1:9093")
        plugin.store = FileCredentialStore(private / "credentials.yaml")
        plugin.load_tokens()
        sent = dict(plugin.write_tokens_to_metadata([]))
        assert sent[ACCESS_TOKEN_KEY].encode() == read_operator_secret(secret)
    assert not private.exists() and sorted(p.name for p in home.iterdir()) == ["config.toml"]
    with pytest.raises(PlasticError, match="no address for the connection 'y'"):
        with operator_env("y", secret):
            pass


def test_submit_never_sends_the_secret_in_the_clear_to_another_host(tmp_path, monkeypatch):
    """An insecure connection to an address that is not loopback is refused before flwr runs
    (flwr would send the stored secret as a Bearer token over plain HTTP); loopback is fine."""
    from plasticlm.fednl.deploy.submit import operator_env

    home = tmp_path / "flwr"
    home.mkdir()
    monkeypatch.setenv("FLWR_HOME", str(home))
    secret = make_operator_secret(tmp_path / "operator.secret")
    for address, refused in (("192.0.2.2:9093", True), ("127.0.0.1:9093", False),
                             ("[::1]:9093", False)):
        (home / "config.toml").write_text('[superlink]\ndefault = "x"\n\n[superlink.x]\n'
                                          f'address = "{address}"\ninsecure = true\n')
        if refused:
            with pytest.raises(PlasticError, match="sent only over TLS or to 127.0.0.1"):
                with operator_env("x", secret):
                    pass
        else:
            with operator_env("x", secret) as env:
                assert Path(env["FLWR_HOME"]) != home
