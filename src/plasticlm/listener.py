"""Bounds on what a connection may cost before its request is read: every HTTP service
plasticlm starts (FedRefine peers and registry, the FedNL SuperLink) runs on uvicorn with
these.

uvicorn's default HTTP parser (httptools, when installed) takes request headers of any size,
and nothing limits how long a client may take to send them or how many connections may sit
idle: a 48 MiB header was parsed for 2.3 s before its 401 (stalling ``/health``), 1,500 idle
connections and 300 slow-header ones stayed open. :class:`BoundedH11Protocol` is uvicorn's
h11 protocol with

- a cap on the request line and headers (h11's incomplete-event size: past it, 400 and the
  connection closed, before the app or any token check runs);
- a deadline for the request line and headers, counted from the connection's first byte, or
  its start, and again for each kept-alive request: past it, the connection is closed;
- a cap on open connections: one past it is closed at once, without reading;

beside uvicorn's own keep-alive timeout and ``limit_concurrency`` (503 past it).
"""

from __future__ import annotations

import asyncio
import dataclasses

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclasses.dataclass(frozen=True)
class ListenerLimits:
    """What one connection may cost before the app sees its request.

    ``max_header_bytes``: request line + headers; ``header_timeout_s``: seconds to send
    them; ``keep_alive_s``: an idle kept-alive connection's life; ``max_connections``: open
    connections at once (one more is closed unread); ``max_requests_in_flight``: requests
    handled at once (one more gets 503).
    """

    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 5.0
    keep_alive_s: int = 5
    max_connections: int = 512
    max_requests_in_flight: int = 256

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ValueError(f"ListenerLimits.{f.name} must be > 0, not {value!r}")

    def uvicorn_options(self) -> dict:
        """Keyword arguments for ``uvicorn.Config`` (or ``uvicorn.run``) that apply these."""
        return {"http": _protocol_for(self), "h11_max_incomplete_event_size":
                self.max_header_bytes, "timeout_keep_alive": self.keep_alive_s,
                "limit_concurrency": self.max_requests_in_flight}


DEFAULT_LIMITS = ListenerLimits()


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a connection cap (the limits are the
    class attribute ``limits``; :func:`_protocol_for` makes a subclass per setting)."""

    limits: ListenerLimits = DEFAULT_LIMITS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        if len(self.connections) > self.limits.max_connections:
            # closed before a byte is read: a flood of connections cannot grow the set
            self.transport.close()
            return
        self._start_header_deadline()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and self._header_deadline is None:
            self._start_header_deadline()     # a kept-alive connection's next request
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._stop_header_deadline()      # the request line and headers are in

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_deadline()
        super().connection_lost(exc)

    def _start_header_deadline(self) -> None:
        self._header_deadline = self.loop.call_later(self.limits.header_timeout_s,
                                                     self._headers_too_slow)

    def _stop_header_deadline(self) -> None:
        if getattr(self, "_header_deadline", None) is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.warning("closed a connection that sent no complete request headers "
                                "in %.1f s", self.limits.header_timeout_s)
            self.transport.close()


def _protocol_for(limits: ListenerLimits) -> type[BoundedH11Protocol]:
    if limits == BoundedH11Protocol.limits:
        return BoundedH11Protocol
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"limits": limits})
