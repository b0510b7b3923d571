"""Bounds on what a connection may cost before and while its request is read: every HTTP
service plasticlm starts (FedRefine peers and registry, the FedNL SuperLink) runs on uvicorn
with these.

uvicorn's default HTTP parser (httptools, when installed) takes request headers of any size,
and nothing limits how long a client may take to send them or how many connections may sit
idle: a 48 MiB header was parsed for 2.3 s before its 401 (stalling ``/health``), 1,500 idle
connections and 300 slow-header ones stayed open. :class:`BoundedH11Protocol` is uvicorn's
h11 protocol with

- a cap on the request line and headers (h11's incomplete-event size: past it, 400 and the
  connection closed, before the app or any token check runs);
- a deadline for the request line and headers, counted from the connection's start, or from
  the first byte of each kept-alive request, and a deadline for the whole request (headers
  and body) once the headers are in: past either, the connection is closed;
- a cap on open connections: at the cap, a new connection evicts the oldest one that has no
  request in progress (idle, or still sending its headers), so a flood of idle connections
  cannot lock out a newcomer; when every connection is mid-request, the newcomer is closed.

uvicorn's ``limit_concurrency`` is not used: it counts connections, so 256 idle sockets made
every request, ``/health`` and the operator's included, a 503. Requests in flight are bounded
by each app (FedRefine's guard: ``max_concurrent``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclasses.dataclass(frozen=True)
class ListenerLimits:
    """What one connection may cost.

    ``max_header_bytes``: request line + headers; ``header_timeout_s``: seconds to send
    them; ``request_timeout_s``: seconds for the whole request once its headers are in (a body
    sent a byte at a time); ``keep_alive_s``: an idle kept-alive connection's life;
    ``max_connections``: open connections at once.
    """

    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 5.0
    request_timeout_s: float = 120.0
    keep_alive_s: int = 5
    max_connections: int = 512

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ValueError(f"ListenerLimits.{f.name} must be > 0, not {value!r}")

    def uvicorn_options(self) -> dict:
        """Keyword arguments for ``uvicorn.Config`` (or ``uvicorn.run``) that apply these."""
        return {"http": _protocol_for(self), "h11_max_incomplete_event_size":
                self.max_header_bytes, "timeout_keep_alive": self.keep_alive_s}


DEFAULT_LIMITS = ListenerLimits()


def _waiting(server_state) -> OrderedDict:
    """The server's connections with no request in progress, oldest first (evictable)."""
    if not hasattr(server_state, "plasticlm_waiting"):
        server_state.plasticlm_waiting = OrderedDict()
    return server_state.plasticlm_waiting


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header and request deadlines and an evicting connection
    cap (the limits are the class attribute ``limits``; :func:`_protocol_for` makes a
    subclass per setting)."""

    limits: ListenerLimits = DEFAULT_LIMITS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        waiting = _waiting(self.server_state)
        if len(self.connections) > self.limits.max_connections:
            oldest = next(iter(waiting), None)
            if oldest is None:     # every connection is mid-request: this one waits its turn
                self.transport.close()
                return
            oldest.logger.warning("connection limit (%d) reached: closed the oldest idle "
                                  "connection", self.limits.max_connections)
            oldest._close()
        waiting[self] = None
        self._arm(self.limits.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and self._deadline is None:
            self._arm(self.limits.header_timeout_s)   # a kept-alive connection's next request
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.IDLE:
            return
        waiting = _waiting(self.server_state)
        if self in waiting:                             # the headers are in: a request now
            waiting.pop(self)
            self._arm(self.limits.request_timeout_s)
        if state is not h11.SEND_BODY:                  # the whole request is in
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            _waiting(self.server_state)[self] = None    # kept alive, idle: evictable

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        _waiting(self.server_state).pop(self, None)
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._too_slow, seconds)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self, seconds: float) -> None:
        self._deadline = None
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
            self.logger.warning("closed a connection that did not send its request in %.1f s",
                                seconds)
            self._close()

    def _close(self) -> None:
        _waiting(self.server_state).pop(self, None)
        self.transport.close()


def _protocol_for(limits: ListenerLimits) -> type[BoundedH11Protocol]:
    if limits == BoundedH11Protocol.limits:
        return BoundedH11Protocol
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"limits": limits})
