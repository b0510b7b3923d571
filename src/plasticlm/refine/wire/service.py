"""FedRefine as network services (FastAPI on uvicorn): a *peer* serves one model (prefill a
prompt and return its cache; receive caches and answer; ask its configured peers for help),
and a *registry* serves the fuser of every ordered pair.

Every request passes the guard first (token, body size, requests in flight:
:mod:`plasticlm.refine.wire.guard`), then its limits in tokens (:mod:`plasticlm.refine.wire.requests`),
then the codec's checks and the shapes against the fuser that will read it; a bad one gets a
4xx with the reason and changes nothing. Model calls run one at a time per process (one model,
one lock).
"""

from __future__ import annotations

import threading
import time

import torch
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from plasticlm.errors import PlasticError
from plasticlm.refine.fedrefine import FedRefine
from plasticlm.refine.link import Link
from plasticlm.refine.modes import MODES, RefineConfig
from plasticlm.refine.peer import Peer
from plasticlm.refine.wire.codec import PayloadError, decode_bundle, encode_bundle, encode_fuser
from plasticlm.refine.wire.fuser_registry import check_name, load_registered, registered_pairs
from plasticlm.refine.wire.guard import ServiceGuard
from plasticlm.refine.wire.quant import QUANTS
from plasticlm.refine.wire.remote import FuserSource, PeerUnavailable, Received, RemotePeer
from plasticlm.refine.wire.requests import AskRequest, GenerateRequest, PrefillRequest, check_limits
from plasticlm.refine.wire.serving import ServiceConfig, reply_errors


def guarded(app: FastAPI, config: ServiceConfig) -> ServiceGuard:
    """``app`` behind the guard that checks the token, the body size and the requests in
    flight before the app reads anything."""
    return ServiceGuard(app, config.token, config.max_payload_bytes, config.max_concurrent)


def _result(fr: FedRefine, ask: AskRequest, skipped: list[str]) -> dict:
    """Score or answer ``ask`` with ``fr``; alone (and said so) when no transmitter is left."""
    mode = ask.mode if fr.links or not MODES[ask.mode].uses_links else "alone"
    n = getattr(ask, "transmitters", None)
    out: dict = {"mode": mode, "skipped": skipped,
                 "took_part": [link.peer.name for link in fr.links_for(mode, n)]}
    if mode != ask.mode:
        out["note"] = "no transmitter took part: the receiver answered alone"
    if ask.choices:
        s = fr.score(ask.prompt, ask.choices, mode, n)
        out.update(choice=ask.choices[s.choice], scores=s.scores, wire_bytes=s.wire_bytes,
                   seconds=s.seconds, latency=s.latency, ttft=s.ttft)
    else:
        a = fr.ask(ask.prompt, mode, ask.max_new_tokens, n)
        out.update(answer=a.text, wire_bytes=a.wire_bytes, seconds=a.seconds, latency=a.latency,
                   ttft=a.ttft)
        if a.background:
            out["background"] = a.background
    return out


def peer_app(peer: Peer, fusers: FuserSource | None = None,
             config: ServiceConfig | None = None) -> ServiceGuard:
    """The service of one device's model ``peer`` (``fusers``: where it finds the fuser from
    each transmitter into itself, needed to answer with caches)."""
    config = config or ServiceConfig()
    app = FastAPI(title=f"plasticlm peer {peer.name}")
    reply_errors(app)
    lock = threading.Lock()
    remotes = [RemotePeer(u, config.token, config.peer_timeout, config.quant, config.verify,
                          config.max_payload_bytes, config.connect_timeout)
               for u in config.peers]

    def run(fn, *a):
        def locked():
            with lock, torch.no_grad():
                return fn(*a)
        return run_in_threadpool(locked)

    def check_mode(mode: str) -> None:
        if not MODES[mode].served:
            served = ", ".join(name for name, m in MODES.items() if m.served)
            raise PlasticError(f"mode {mode!r} is not served (it runs both models in one "
                               f"process); use one of {served}")

    def fuser_for(name: str):
        if fusers is None:
            raise PlasticError(f"{peer.name} has no fuser registry (serve it with --registry)")
        return fusers.fuser(name, peer.name)

    def check_ask(ask: AskRequest) -> None:
        check_mode(ask.mode)
        check_limits(config, peer.tokenizer, ask.prompt, ask.choices,
                     0 if ask.choices else ask.max_new_tokens)

    @app.get("/health")
    def health() -> dict:
        return {"ok": True, "name": peer.name}

    @app.get("/info")
    def info() -> dict:
        lay = peer.layout
        return {"name": peer.name, "model_type": lay.model_type, "num_layers": lay.num_layers,
                "num_kv_heads": lay.num_kv_heads, "head_dim": lay.head_dim,
                "rope_scaling": lay.rope_scaling, "inv_freq": lay.inv_freq.tolist(),
                "quants": list(QUANTS), "max_payload_bytes": config.max_payload_bytes}

    @app.post("/prefill")
    async def prefill(req: PrefillRequest) -> Response:
        check_limits(config, peer.tokenizer, req.text, new_tokens=req.draft_tokens)
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

    @app.post("/generate")
    async def generate(req: GenerateRequest) -> dict:
        check_limits(config, peer.tokenizer, req.text, new_tokens=req.max_new_tokens)
        return {"text": await run(peer.generate, req.text, req.max_new_tokens,
                                  tuple(req.stop))}

    @app.post("/answer")
    async def answer(request: Request) -> dict:
        """Answer with the caches in the body (a codec bundle whose request is an AskRequest
        plus optional t2t ``background`` texts)."""
        body = await request.body()     # bounded by the guard while it streams
        meta, sent = await run_in_threadpool(decode_bundle, body, config.max_payload_bytes)
        background = meta.pop("background", [])
        try:
            ask = AskRequest(**meta)
        except ValueError as e:
            raise PayloadError(f"bundle request is not valid: {str(e).splitlines()[0]}") from None
        check_ask(ask)
        if not isinstance(background, list) or not all(isinstance(b, str) for b in background):
            raise PayloadError("'background' must be a list of texts")
        links = [Link(Received(tr), fuser_for(tr.cache.model_name)) for tr in sent]
        links += [Link(Received(background=b, name=f"text{i}")) for i, b in enumerate(background)]
        for link in links:
            if link.fuser is not None:
                link.fuser.check(peer.layout, link.peer.layout)
        fr = FedRefine(peer, links, RefineConfig(private=ask.private, order=ask.order))
        return await run(_result, fr, ask, [])

    @app.post("/ask")
    async def ask(req: AskRequest) -> dict:
        """Answer ``prompt`` helped by this receiver's configured peers; a peer that is down,
        slow or refuses is skipped and named."""
        check_ask(req)
        links, skipped = [], []
        if MODES[req.mode].uses_links:
            for remote in remotes:
                try:
                    fuser = fuser_for(remote.name) if MODES[req.mode].reads_caches else None
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

    return guarded(app, config)


def registry_app(folder: str, config: ServiceConfig | None = None) -> ServiceGuard:
    """The fuser registry service over a registry folder (``refine pretrain-fuser`` fills it)."""
    config = config or ServiceConfig()
    app = FastAPI(title="plasticlm fuser registry")
    reply_errors(app)

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    @app.get("/pairs")
    def pairs() -> list[dict]:
        return [{"transmitter": t, "receiver": r} for t, r in registered_pairs(folder)]

    @app.get("/fusers/{transmitter}/{receiver}")
    def fuser(transmitter: str, receiver: str) -> Response:
        try:
            check_name(transmitter, "transmitter")
            check_name(receiver, "receiver")
        except PlasticError as e:
            raise HTTPException(400, str(e)) from None
        try:
            f = load_registered(folder, transmitter, receiver)
        except PlasticError as e:
            raise HTTPException(404, str(e)) from None
        return Response(encode_fuser(f), media_type="application/octet-stream")

    return guarded(app, config)


