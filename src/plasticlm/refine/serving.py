"""Running a FedRefine service (:mod:`plasticlm.refine.service`): its config (access token,
payload limit, the peers it may ask, how their caches travel), its guards (the token, the
body size before it is read, errors as 4xx replies) and listening (port, TLS, uvicorn)."""

from __future__ import annotations

import hmac
import logging
import socket
import ssl
import urllib.parse
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import AfterValidator

from plasticlm.config import Field, configclass
from plasticlm.errors import PlasticError
from plasticlm.refine.codec import MAX_PAYLOAD_BYTES, PayloadError
from plasticlm.refine.quant import QUANTS

log = logging.getLogger("plasticlm.refine.service")


def _http_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http:// or https:// URL with a host")
    return url


@configclass
class ServiceConfig:
    """Limits and access of a peer or registry service."""

    token: str | None = Field(None, description="clients must send 'Authorization: Bearer "
                              "<token>' (the CLI reads it from $PLASTICLM_TOKEN)")
    max_payload_bytes: int = Field(MAX_PAYLOAD_BYTES, gt=0, description="largest request "
                                   "body, refused before it is read")
    peers: tuple[Annotated[str, AfterValidator(_http_url)], ...] = Field(
        (), description="peer URLs this receiver may ask for help (/ask)")
    peer_timeout: float = Field(30.0, gt=0, description="seconds before a slow peer is "
                                "skipped")
    quant: Annotated[str, QUANTS.key] = Field("bf16", description="how this receiver asks "
                                              "its peers to send caches (QUANTS)")
    verify: str | bool = Field(True, description="CA bundle of peers behind a private TLS "
                               "CA (true: the system's)")


def auth(config: ServiceConfig):
    def check(request: Request) -> None:
        if config.token is None:
            return
        sent = request.headers.get("authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {config.token}".encode()):
            raise HTTPException(401, "missing or wrong token (send 'Authorization: Bearer "
                                     "<token>')")
    return Depends(check)


async def read_limited(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit`` bytes (before it is
    parsed, and before a lying Content-Length is believed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"payload of {declared} bytes exceeds the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"payload exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def reply_errors(app: FastAPI) -> None:
    @app.exception_handler(PayloadError)
    async def _payload(_, e: PayloadError):
        log.warning("refused payload: %s", e)
        return JSONResponse({"detail": str(e)}, status_code=400)

    @app.exception_handler(PlasticError)
    async def _plastic(_, e: PlasticError):
        log.warning("refused request: %s", e)
        return JSONResponse({"detail": str(e)}, status_code=422)


def check_url(url: str, what: str) -> None:
    """An http(s) URL with a host, or one line saying what was given."""
    try:
        _http_url(url)
    except ValueError as e:
        raise PlasticError(f"{what} {url!r} is {e}") from None


def check_listen(host: str, port: int, tls_cert: str = "", tls_key: str = "") -> None:
    """Refuse, in one line and before anything is loaded, what would stop a service from
    starting: a port out of range or taken, a TLS pair that is incomplete or unreadable."""
    if not 1 <= port <= 65535:
        raise PlasticError(f"--port must be in 1..65535, not {port}")
    if bool(tls_cert) != bool(tls_key):
        raise PlasticError("TLS needs both --tls-cert and --tls-key")
    if tls_cert:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(tls_cert, tls_key)
        except (OSError, ssl.SSLError) as e:
            raise PlasticError(f"could not load the TLS certificate {tls_cert} and key {tls_key}: "
                               f"{e}") from None
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise PlasticError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def serve(app: FastAPI, host: str, port: int, tls_cert: str = "", tls_key: str = "") -> None:
    """Run ``app`` on uvicorn until interrupted."""
    import uvicorn

    check_listen(host, port, tls_cert, tls_key)
    # A kept-alive client connection must not hold a stopping service for ever.
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3,
                ssl_certfile=tls_cert or None, ssl_keyfile=tls_key or None)
