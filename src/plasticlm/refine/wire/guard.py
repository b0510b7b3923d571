"""The guard in front of every FedRefine service (a pure ASGI middleware, outside FastAPI):
it refuses before anything is read. In order: the bearer token (401), the declared body size
(413), the number of requests in flight (503); then, while the body streams in, its size as it
arrives (413 once past the limit, whatever Content-Length said or when there was none).

A refusal closes the connection (``Connection: close``), so a client cannot keep the server
busy with the rest of a body it was told is unwanted."""

from __future__ import annotations

import hmac
import json
import logging

log = logging.getLogger("plasticlm.refine.wire.service")

OPEN_PATHS = frozenset({"/health"})   # answered without the token: liveness probes


class _BodyTooLarge(Exception):
    """Raised into the app by ``receive`` once the body passes the limit."""


async def refuse(send, status: int, detail: str, headers: tuple = ()) -> None:
    """Answer ``status`` with ``{"detail": detail}`` and close the connection."""
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": body})


def _values(scope, name: bytes) -> list[bytes]:
    return [v for k, v in scope["headers"] if k.lower() == name]


class ServiceGuard:
    """Wraps ``app``: ``token`` (None: none asked), ``max_body_bytes`` per request body,
    ``max_concurrent`` requests in flight (a non-blocking semaphore: one more is refused with
    503, never queued)."""

    def __init__(self, app, token: str | None, max_body_bytes: int, max_concurrent: int,
                 open_paths: frozenset[str] = OPEN_PATHS):
        self.app, self.max_body_bytes, self.max_concurrent = app, max_body_bytes, max_concurrent
        self.expected = f"Bearer {token}".encode() if token else None
        self.open_paths = open_paths
        self.in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, send)
        if scope["type"] != "http":        # no websocket route exists: nothing to reach
            return await send({"type": "websocket.close", "code": 1008})
        why = self._refusal(scope)
        if why is not None:
            log.warning("refused %s %s: %s", scope["method"], scope["path"], why[1])
            return await refuse(send, *why)
        # No await between the test and the increment: the event loop cannot interleave.
        self.in_flight += 1
        try:
            await self._limited(scope, receive, send)
        finally:
            self.in_flight -= 1

    def _refusal(self, scope) -> tuple | None:
        """(status, reason[, headers]) when the headers alone refuse the request."""
        if self.expected is not None and scope["path"] not in self.open_paths:
            sent = _values(scope, b"authorization")
            # compare_digest: the time taken does not tell how much of a guess was right
            if len(sent) != 1 or not hmac.compare_digest(sent[0], self.expected):
                return 401, "missing or wrong token (send 'Authorization: Bearer <token>')"
        declared = _values(scope, b"content-length")
        if len(declared) > 1 or (declared and not declared[0].isdigit()):
            return 400, "malformed Content-Length"
        if declared and int(declared[0]) > self.max_body_bytes:
            return 413, (f"payload of {int(declared[0])} bytes exceeds the limit of "
                         f"{self.max_body_bytes}")
        if self.in_flight >= self.max_concurrent:
            return 503, (f"busy: {self.max_concurrent} requests in flight (max_concurrent); "
                         "retry later"), ((b"retry-after", b"1"),)
        return None

    async def _limited(self, scope, receive, send) -> None:
        """Run the app with a ``receive`` that counts the body's bytes as they arrive; past
        the limit the app's own answer is dropped and a 413 sent instead."""
        read, over, started = 0, False, False

        async def counted():
            nonlocal read, over
            if over:   # the app caught the refusal and asks again: the client is gone for it
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.max_body_bytes:
                    over = True
                    raise _BodyTooLarge
            return message

        async def answer(message):
            nonlocal started
            if over:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, answer)
        except Exception:
            if not over:
                raise
        if over:
            detail = f"payload exceeds the limit of {self.max_body_bytes} bytes"
            log.warning("refused %s %s: %s", scope["method"], scope["path"], detail)
            if not started:
                await refuse(send, 413, detail)
