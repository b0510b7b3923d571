"""Bounded before the token (issue 56, item 4): every HTTP service plasticlm starts (the fuser
registry and peers through ``refine.serving.serve``, the gated FedNL SuperLink) refuses a huge
header fast without stalling ``/health``, closes idle, slow-header and slow-body connections,
and at its connection cap evicts an idle connection for a newcomer; each a real uvicorn server
in another process, over real sockets."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from plasticlm.fednl.deploy.processes import flower_env, free_ports, wait_port
from plasticlm.listener import DEFAULT_LIMITS, BoundedH11Protocol, ListenerLimits

TOKEN = "listener-test-token-0123456789"
MB = 2**20
# a tiny app under small limits: the cap and the request deadline within a test's seconds
SMALL = """
import sys, uvicorn
from plasticlm.listener import ListenerLimits
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
limits = ListenerLimits(header_timeout_s=1.5, request_timeout_s=2.0, max_connections=20)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            **limits.uvicorn_options())
"""
REGISTRY = """
import sys
from plasticlm.refine.wire.serving import ServiceConfig, serve
from plasticlm.refine.wire.service import registry_app
serve(registry_app(sys.argv[1], ServiceConfig(token=sys.argv[3])), "127.0.0.1", int(sys.argv[2]))
"""


def _start(args: list[str], port: int, log: Path, env: dict | None = None) -> subprocess.Popen:
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_port(port, 60, proc, log)
    except BaseException:
        proc.kill()
        raise
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """The fuser registry service (``refine registry``'s app and ``serve``) on a free port."""
    folder = tmp_path_factory.mktemp("registry")
    (port,) = free_ports(1)
    proc = _start([sys.executable, "-c", REGISTRY, str(folder), str(port), TOKEN], port,
                  folder.parent / "registry.log")
    yield port
    _stop(proc)


@pytest.fixture
def small(tmp_path):
    """A tiny app on uvicorn with ListenerLimits(header 1.5 s, request 2 s, 20 connections)."""
    (port,) = free_ports(1)
    proc = _start([sys.executable, "-c", SMALL, str(port)], port, tmp_path / "small.log")
    yield port
    _stop(proc)


def _closed(sockets: list[socket.socket]) -> int:
    """How many of ``sockets`` the server has closed (reset or EOF)."""
    n = 0
    for s in sockets:
        s.setblocking(False)
        try:
            n += s.recv(1024) == b""
        except BlockingIOError:
            pass
        except OSError:
            n += 1
    return n


def _health_seconds(port: int) -> float:
    """Seconds for a plain GET /health to be answered 200."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200"), reply[:80]
    return time.monotonic() - t0


def _huge_header_seconds(port: int, size: int, scheme_tls: bool = False) -> tuple[float, bytes]:
    """Send a request whose one header is ``size`` bytes, no token; seconds until the server
    answered or closed, and what it said."""
    t0 = time.monotonic()
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        try:
            s.sendall(b"GET /pairs HTTP/1.1\r\nHost: x\r\nX-Big: ")
            block = b"a" * MB
            for _ in range(size // MB):
                s.sendall(block)
            s.sendall(b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass            # refused while it was still sending: what a bound should do
        try:
            while chunk := s.recv(4096):
                got += chunk
        except ConnectionResetError:
            pass
    return time.monotonic() - t0, got


def test_limits_are_positive_and_uvicorns_connection_counting_503_is_not_used():
    with pytest.raises(ValueError, match="header_timeout_s"):
        ListenerLimits(header_timeout_s=0)
    options = DEFAULT_LIMITS.uvicorn_options()
    assert options["http"] is BoundedH11Protocol and "limit_concurrency" not in options
    faster = ListenerLimits(header_timeout_s=1.0).uvicorn_options()["http"]
    assert issubclass(faster, BoundedH11Protocol) and faster.limits.header_timeout_s == 1.0


def test_at_the_cap_a_newcomer_evicts_the_oldest_idle_connection(small):
    """50 idle connections to a server capped at 20: the 30 oldest are closed as the others
    arrive, and /health, asked while 20 idle ones are open, answers at once (uvicorn's
    limit_concurrency answered 503 to everyone once 256 sockets sat idle)."""
    idle = [socket.create_connection(("127.0.0.1", small), timeout=5) for _ in range(50)]
    time.sleep(0.3)
    assert _closed(idle) >= 29
    assert _health_seconds(small) < 0.5
    for s in idle:
        s.close()


def test_a_body_sent_a_byte_at_a_time_is_closed_at_the_request_deadline(small):
    """Headers in time, then a body at a byte every 0.25 s: closed at the 2 s request deadline
    (the header deadline no longer applies once the headers are in)."""
    with socket.create_connection(("127.0.0.1", small), timeout=10) as s:
        s.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        t0 = time.monotonic()
        closed_at = None
        while time.monotonic() - t0 < 6:
            try:
                s.sendall(b"a")
            except OSError:
                closed_at = time.monotonic() - t0
                break
            time.sleep(0.25)
    assert closed_at is not None and 1.5 < closed_at < 3.5, closed_at


def test_huge_header_refused_fast_while_health_answers(registry):
    """A 48 MiB header without a token is refused in < 0.5 s, and /health, asked while it is
    being sent, answers in < 0.5 s (before: 2.3 s to a 401, /health stalled)."""
    timing: dict[str, float] = {}

    def health_during():
        time.sleep(0.02)
        timing["health"] = _health_seconds(registry)
    side = threading.Thread(target=health_during)
    side.start()
    seconds, reply = _huge_header_seconds(registry, 48 * MB)
    side.join(10)
    assert seconds < 0.5, seconds
    assert reply == b"" or reply.startswith(b"HTTP/1.1 400"), reply[:80]
    assert timing["health"] < 0.5, timing
    assert _health_seconds(registry) < 0.5     # still serving afterwards


@pytest.mark.slow
def test_idle_and_slow_header_connections_closed(registry):
    """1,500 idle connections and 50 that send their headers a byte a second are all closed
    by the server within 10 s, while /health keeps answering."""
    idle = [socket.create_connection(("127.0.0.1", registry), timeout=20) for _ in range(1500)]
    slow = [socket.create_connection(("127.0.0.1", registry), timeout=20) for _ in range(50)]
    for s in slow:
        s.sendall(b"GET /health HTTP/1.1\r\n")
    assert _health_seconds(registry) < 0.5       # during the flood: it evicts an idle one
    t0 = time.monotonic()
    open_socks = idle + slow
    while open_socks and time.monotonic() - t0 < 12:
        for s in slow:
            try:
                s.send(b"X")
            except OSError:
                pass
        still = []
        for s in open_socks:
            s.setblocking(False)
            try:
                if s.recv(1024) != b"":
                    still.append(s)       # a reply without closing: count it as open
            except BlockingIOError:
                still.append(s)
            except OSError:
                pass                      # reset: closed
        open_socks = still
        time.sleep(0.5)
    closed_in = time.monotonic() - t0
    for s in idle + slow:
        s.close()
    assert not open_socks, f"{len(open_socks)} connections still open after {closed_in:.1f} s"
    assert closed_in < 10, closed_in
    assert _health_seconds(registry) < 0.5


@pytest.mark.slow
def test_gated_superlink_refuses_huge_header_fast(tmp_path):
    """The same bound on plasticlm's SuperLink (Flower's app behind the operator gate)."""
    (port,) = free_ports(1)
    proc = _start([sys.executable, "-m", "plasticlm.fednl.deploy.superlink", "--insecure", "--host",
                   "127.0.0.1", "--port", str(port)],
                  port, tmp_path / "superlink.log", flower_env(tmp_path / "flwr_home"))
    try:
        seconds, reply = _huge_header_seconds(port, 48 * MB)
        assert seconds < 0.5, seconds
        assert reply == b"" or reply.startswith(b"HTTP/1.1 400"), reply[:80]
        assert _health_seconds(port) < 0.5
    finally:
        _stop(proc)
