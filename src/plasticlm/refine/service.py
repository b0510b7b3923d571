"""FedRefine as network services (FastAPI on uvicorn): a *peer* serves one model (prefill a
prompt and return its cache; receive caches and answer; ask its configured peers for help),
and a *registry* serves the fuser of every ordered pair.

Every payload is checked before use (size before reading, then the codec's checks, then the
shapes against the fuser that will read it); a bad one gets a 4xx with the reason and changes
nothing. Model calls run one at a time per process (one model, one lock).
"""

from __future__ import annotations

import hmac
import logging
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

import torch
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from plasticlm.errors import PlasticError
from plasticlm.refine.codec import (
    MAX_PAYLOAD_BYTES,
    QUANTS,
    PayloadError,
    check_quant,
    decode_bundle,
    encode_bundle,
    encode_fuser,
)
from plasticlm.refine.modes import MODES, FedRefine, Link, RefineConfig
from plasticlm.refine.peer import Peer
from plasticlm.refine.registry import load_registered, registered_pairs
from plasticlm.refine.remote import FuserSource, PeerUnavailable, Received, RemotePeer

log = logging.getLogger("plasticlm.refine.service")
MAX_TEXT_CHARS = 8000
MAX_NEW_TOKENS = 256


@dataclass
class ServiceConfig:
    """Limits and access of a peer or registry service."""

    token: str | None = None                 # clients must send "Authorization: Bearer <token>"
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    peers: list[str] = field(default_factory=list)   # peer URLs this receiver may ask (/ask)
    peer_timeout: float = 30.0               # seconds before a slow peer is skipped
    quant: str = "bf16"                      # how this receiver asks its peers to send caches
    verify: str | bool = True                # CA bundle for peers behind a private TLS CA


def _auth(config: ServiceConfig):
    def check(request: Request) -> None:
        if config.token is None:
            return
        sent = request.headers.get("authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {config.token}".encode()):
            raise HTTPException(401, "missing or wrong token (send 'Authorization: Bearer "
                                     "<token>')")
    return Depends(check)


async def _read_limited(request: Request, limit: int) -> bytes:
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


def _errors(app: FastAPI) -> None:
    @app.exception_handler(PayloadError)
    async def _payload(_, e: PayloadError):
        log.warning("refused payload: %s", e)
        return JSONResponse({"detail": str(e)}, status_code=400)

    @app.exception_handler(PlasticError)
    async def _plastic(_, e: PlasticError):
        log.warning("refused request: %s", e)
        return JSONResponse({"detail": str(e)}, status_code=422)


class PrefillRequest(BaseModel):
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    draft_tokens: int = Field(0, ge=0, le=MAX_NEW_TOKENS)
    layers: list[int] | None = Field(None, max_length=256)
    share: str = Field("all", pattern="^(all|draft)$")
    quant: str = "bf16"


class GenerateRequest(BaseModel):
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    max_new_tokens: int = Field(24, ge=1, le=MAX_NEW_TOKENS)
    stop: list[str] = Field(default_factory=lambda: ["\n"], max_length=8)


class AskRequest(BaseModel):
    prompt: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    mode: str = "c2c"
    choices: list[str] = Field(default_factory=list, max_length=64)
    max_new_tokens: int = Field(24, ge=1, le=MAX_NEW_TOKENS)
    private: bool = False
    order: str = "parallel"
    quant: str | None = None      # /ask: how the peers send caches (default: the service's)


def _result(fr: FedRefine, ask: AskRequest, skipped: list[str]) -> dict:
    """Score or answer ``ask`` with ``fr``; alone (and said so) when no transmitter is left."""
    mode = ask.mode if fr.links or ask.mode == "alone" else "alone"
    out: dict = {"mode": mode, "took_part": [link.peer.name for link in fr.links_for(mode)],
                 "skipped": skipped}
    if mode != ask.mode:
        out["note"] = "no transmitter took part: the receiver answered alone"
    if ask.choices:
        s = fr.score(ask.prompt, ask.choices, mode)
        out.update(choice=ask.choices[s.choice], scores=s.scores, wire_bytes=s.wire_bytes,
                   seconds=s.seconds, latency=s.latency)
    else:
        a = fr.ask(ask.prompt, mode, ask.max_new_tokens)
        out.update(answer=a.text, wire_bytes=a.wire_bytes, seconds=a.seconds, latency=a.latency)
        if a.background:
            out["background"] = a.background
    return out


def peer_app(peer: Peer, fusers: FuserSource | None = None,
             config: ServiceConfig | None = None) -> FastAPI:
    """The service of one device's model ``peer`` (``fusers``: where it finds the fuser from
    each transmitter into itself, needed to answer with caches)."""
    config = config or ServiceConfig()
    app = FastAPI(title=f"plasticlm peer {peer.name}")
    _errors(app)
    auth = _auth(config)
    lock = threading.Lock()
    remotes = [RemotePeer(u, config.token, config.peer_timeout, config.quant, config.verify,
                          config.max_payload_bytes) for u in config.peers]

    def run(fn, *a):
        def locked():
            with lock, torch.no_grad():
                return fn(*a)
        return run_in_threadpool(locked)

    def check_mode(mode: str, order: str = "parallel") -> None:
        if mode not in MODES or mode == "co-c2c":
            raise PlasticError(f"mode {mode!r} is not served; use one of alone, t2t, c2c, "
                               "multi (co-c2c runs both models in one process)")
        if order not in ("parallel", "sequence"):
            raise PlasticError(f"unknown order {order!r}")

    def fuser_for(name: str):
        if fusers is None:
            raise PlasticError(f"{peer.name} has no fuser registry (serve it with --registry)")
        return fusers.fuser(name, peer.name)

    @app.get("/health")
    def health() -> dict:
        return {"ok": True, "name": peer.name}

    @app.get("/info", dependencies=[auth])
    def info() -> dict:
        lay = peer.layout
        return {"name": peer.name, "model_type": lay.model_type, "num_layers": lay.num_layers,
                "num_kv_heads": lay.num_kv_heads, "head_dim": lay.head_dim,
                "rope_scaling": lay.rope_scaling, "inv_freq": lay.inv_freq.tolist(),
                "quants": list(QUANTS), "max_payload_bytes": config.max_payload_bytes}

    @app.post("/prefill", dependencies=[auth])
    async def prefill(req: PrefillRequest) -> Response:
        check_quant(req.quant)
        bad = [x for x in req.layers or [] if not 0 <= x < peer.layout.num_layers]
        if bad:
            raise PlasticError(f"layers {bad} do not exist in {peer.name} "
                               f"({peer.layout.num_layers} layers)")
        sent = await run(peer.prefill, req.text, req.draft_tokens, req.layers, req.share)
        t0 = time.perf_counter()
        body = encode_bundle([sent], quant=req.quant)
        return Response(body, media_type="application/octet-stream",
                        headers={"x-prefill-seconds": f"{sent.seconds['prefill']:.6f}",
                                 "x-encode-seconds": f"{time.perf_counter() - t0:.6f}"})

    @app.post("/generate", dependencies=[auth])
    async def generate(req: GenerateRequest) -> dict:
        return {"text": await run(peer.generate, req.text, req.max_new_tokens,
                                  tuple(req.stop))}

    @app.post("/answer", dependencies=[auth])
    async def answer(request: Request) -> dict:
        """Answer with the caches in the body (a codec bundle whose request is an AskRequest
        plus optional t2t ``background`` texts)."""
        body = await _read_limited(request, config.max_payload_bytes)
        meta, sent = await run_in_threadpool(decode_bundle, body, config.max_payload_bytes)
        background = meta.pop("background", [])
        try:
            ask = AskRequest(**meta)
        except ValueError as e:
            raise PayloadError(f"bundle request is not valid: {str(e).splitlines()[0]}") from None
        check_mode(ask.mode, ask.order)
        if not isinstance(background, list) or not all(isinstance(b, str) for b in background):
            raise PayloadError("'background' must be a list of texts")
        links = [Link(Received(tr), fuser_for(tr.cache.model_name)) for tr in sent]
        links += [Link(Received(background=b, name=f"text{i}")) for i, b in enumerate(background)]
        for link in links:
            if link.fuser is not None:
                link.fuser.check(peer.layout, link.peer.layout)
        fr = FedRefine(peer, links, RefineConfig(private=ask.private, order=ask.order))
        return await run(_result, fr, ask, [])

    @app.post("/ask", dependencies=[auth])
    async def ask(req: AskRequest) -> dict:
        """Answer ``prompt`` helped by this receiver's configured peers; a peer that is down,
        slow or refuses is skipped and named."""
        check_mode(req.mode, req.order)
        check_quant(req.quant or config.quant)
        links, skipped = [], []
        if req.mode != "alone":
            for remote in remotes:
                try:
                    fuser = None if req.mode == "t2t" else fuser_for(remote.name)
                    links.append(Link(remote.using(req.quant or config.quant), fuser))
                except (PeerUnavailable, PlasticError) as e:
                    skipped.append(str(e))

        def answer_without_failing_peers():
            alive = list(links)
            while True:
                fr = FedRefine(peer, alive, RefineConfig(private=req.private, order=req.order))
                try:
                    return _result(fr, req, skipped)
                except PeerUnavailable as e:   # went away mid-request: answer without it
                    skipped.append(str(e))
                    gone = [link for link in alive if str(e).startswith(link.peer.url)]
                    alive = [link for link in alive if link not in gone] if gone else []

        return await run(answer_without_failing_peers)

    return app


def registry_app(folder: str, config: ServiceConfig | None = None) -> FastAPI:
    """The fuser registry service over a registry folder (``refine pretrain-fuser`` fills it)."""
    config = config or ServiceConfig()
    app = FastAPI(title="plasticlm fuser registry")
    _errors(app)
    auth = _auth(config)

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    @app.get("/pairs", dependencies=[auth])
    def pairs() -> list[dict]:
        return [{"transmitter": t, "receiver": r} for t, r in registered_pairs(folder)]

    @app.get("/fusers/{transmitter}/{receiver}", dependencies=[auth])
    def fuser(transmitter: str, receiver: str) -> Response:
        try:
            f = load_registered(folder, transmitter, receiver)
        except PlasticError as e:
            raise HTTPException(404, str(e)) from None
        return Response(encode_fuser(f), media_type="application/octet-stream")

    return app


def check_url(url: str, what: str) -> None:
    """An http(s) URL with a host, or one line saying what was given."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PlasticError(f"{what} {url!r} is not an http:// or https:// URL with a host")


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
