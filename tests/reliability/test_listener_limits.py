"""Bounded before the token (issue 56, item 4): every HTTP service plasticlm starts (the fuser
registry and peers through ``refine.serving.serve``, the gated FedNL SuperLink) refuses a huge
header fast without stalling ``/health``, and closes idle and slow-header connections, as a
real uvicorn server in another process, over real sockets."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from plasticlm.fednl.processes import flower_env, free_ports, wait_port
from plasticlm.listener import DEFAULT_LIMITS, BoundedH11Protocol, ListenerLimits

TOKEN = "listener-test-token-0123456789"
MB = 2**20
REGISTRY = """
import sys
from plasticlm.refine.serving import ServiceConfig, serve
from plasticlm.refine.service import registry_app
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


def test_limits_are_positive():
    with pytest.raises(ValueError, match="header_timeout_s"):
        ListenerLimits(header_timeout_s=0)
    assert DEFAULT_LIMITS.uvicorn_options()["http"] is BoundedH11Protocol
    faster = ListenerLimits(header_timeout_s=1.0).uvicorn_options()["http"]
    assert issubclass(faster, BoundedH11Protocol) and faster.limits.header_timeout_s == 1.0


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
    proc = _start([sys.executable, "-m", "plasticlm.fednl.superlink", "--insecure", "--host",
                   "127.0.0.1", "--port", str(port)],
                  port, tmp_path / "superlink.log", flower_env(tmp_path / "flwr_home"))
    try:
        seconds, reply = _huge_header_seconds(port, 48 * MB)
        assert seconds < 0.5, seconds
        assert reply == b"" or reply.startswith(b"HTTP/1.1 400"), reply[:80]
        assert _health_seconds(port) < 0.5
    finally:
        _stop(proc)
