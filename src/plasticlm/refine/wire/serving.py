"""Running a FedRefine service (:mod:`plasticlm.refine.wire.service`): its config (access token,
limits, the peers it may ask, how their caches travel), errors as 4xx replies and listening
(port, TLS, uvicorn). The guard that refuses before reading is :mod:`plasticlm.refine.wire.guard`."""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
import urllib.parse
from typing import Annotated

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import AfterValidator

from plasticlm.config import Field, configclass
from plasticlm.errors import PlasticError
from plasticlm.listener import DEFAULT_LIMITS
from plasticlm.refine.wire.codec import MAX_PAYLOAD_BYTES, PayloadError
from plasticlm.refine.wire.quant import QUANTS

log = logging.getLogger("plasticlm.refine.wire.service")

MIN_TOKEN_CHARS = 16
CONNECT_TIMEOUT = 5.0


def _http_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http:// or https:// URL with a host")
    return url


@configclass
class ServiceConfig:
    """Limits and access of a peer or registry service."""

    token: str | None = Field(None, min_length=MIN_TOKEN_CHARS, description="clients must "
                              "send 'Authorization: Bearer <token>' (the CLI reads it from "
                              "$PLASTICLM_TOKEN, never from a file or --set)")
    max_payload_bytes: int = Field(MAX_PAYLOAD_BYTES, gt=0, description="largest request "
                                   "body in bytes: a larger Content-Length is refused (413) "
                                   "before reading, a body without one once it passes it")
    max_concurrent: int = Field(8, gt=0, description="requests in flight at once; one more "
                                "is refused (503), not queued")
    max_choices: int = Field(16, gt=0, description="answer choices one request may score "
                             "(413 beyond)")
    max_choice_tokens: int = Field(64, gt=0, description="tokens of each answer choice, as "
                                   "the receiver's tokenizer counts them (413 beyond)")
    max_prompt_tokens: int = Field(2048, gt=0, description="tokens of a prompt or text to "
                                   "prefill, as this model's tokenizer counts them (413 "
                                   "beyond)")
    max_new_tokens: int = Field(256, gt=0, description="tokens one request may generate or "
                                "draft (413 beyond)")
    peers: tuple[Annotated[str, AfterValidator(_http_url)], ...] = Field(
        (), description="peer URLs this receiver may ask for help (/ask)")
    peer_timeout: float = Field(30.0, gt=0, description="seconds a peer or registry may "
                                "take to answer (read timeout) before it is skipped")
    connect_timeout: float = Field(CONNECT_TIMEOUT, gt=0, description="seconds to connect to "
                                   "a peer or registry before it is skipped")
    quant: Annotated[str, QUANTS.key] = Field("bf16", description="how this receiver asks "
                                              "its peers to send caches (QUANTS)")
    verify: str | bool = Field(True, description="CA bundle of peers behind a private TLS "
                               "CA (true: the system's)")


class TooLarge(PlasticError):
    """A request past one of the service's limits (answered 413, naming the setting)."""


def check_token(token: str | None, host: str) -> None:
    """Refuse, at start-up and in one line, a token too short to be secret, or no token on an
    address other hosts can reach."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        size = f"{len(token)} characters" if token else "empty"
        raise PlasticError(f"PLASTICLM_TOKEN is {size}: a token needs at least "
                           f"{MIN_TOKEN_CHARS} (export PLASTICLM_TOKEN=$(openssl rand -hex 16))")
    if token is not None and (not token.isprintable() or any(c.isspace() for c in token)):
        # 16 spaces are as easy to guess as none, and a header cannot carry them intact
        raise PlasticError("PLASTICLM_TOKEN holds spaces or control characters: a token is "
                           "one word (export PLASTICLM_TOKEN=$(openssl rand -hex 16))")
    if token is None and not _loopback(host):
        raise PlasticError(f"serving on {host} needs a token, or anyone who reaches it may "
                           "use it: export PLASTICLM_TOKEN=$(openssl rand -hex 16), or listen "
                           "on 127.0.0.1")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def reply_errors(app: FastAPI) -> None:
    @app.exception_handler(TooLarge)
    async def _large(_, e: TooLarge):
        log.warning("refused request: %s", e)
        return JSONResponse({"detail": str(e)}, status_code=413)

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
    # A kept-alive client connection must not hold a stopping service for ever; header size,
    # header time and open connections are bounded before the guard reads the token.
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3,
                ssl_certfile=tls_cert or None, ssl_keyfile=tls_key or None,
                **DEFAULT_LIMITS.uvicorn_options())
