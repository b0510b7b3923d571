"""``plasticlm refine ask``, ``serve`` and ``registry``: answering with transmitters' help, in
one process or over the network (peers and a fuser registry as HTTP services). Building the
parsers imports nothing heavy; the choices of a mode, an order and a quantisation are checked
(and listed in ``--help``) from their registries when the command runs."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

from plasticlm.cli.options import (
    HelpFormatter,
    add_config_options,
    add_option_config,
    add_runtime_options,
    load_from_args,
    non_empty,
)


def _choices_text(*which: str) -> Callable[[], str]:
    """An epilog naming the valid ``--mode``, ``--order`` and ``--quant`` values, built from
    their registries only when help is shown."""
    def text() -> str:
        from plasticlm.refine.modes import MODES, ORDERS
        from plasticlm.refine.wire.quant import QUANTS

        known = {"mode": ("FedRefine modes", MODES), "order": ("orders", ORDERS),
                 "quant": ("cache quantisations", QUANTS)}
        return "\n".join(f"{known[w][0]} (--{w}): {', '.join(known[w][1])}" for w in which)
    return text


def add_ask(rsub: argparse._SubParsersAction) -> None:
    q = rsub.add_parser("ask", help="answer a prompt in one mode",
                        description="Answer a prompt with the receiver, helped by transmitters "
                        "through their fusers (one --transmitter/--fuser pair each).",
                        formatter_class=HelpFormatter, epilog=_choices_text("mode", "order",
                                                                            "quant"))
    q.add_argument("prompt")
    q.add_argument("--receiver", required=True)
    q.add_argument("--transmitter", action="append", default=[])
    q.add_argument("--fuser", action="append", default=[], help="fuser folder, one per "
                   "--transmitter, in the same order")
    q.add_argument("--registry", default="", help="take each transmitter's fuser from this "
                   "registry instead of --fuser")
    q.add_argument("--reverse-fuser", help="receiver -> transmitter fuser (co-c2c)")
    q.add_argument("--mode", default="c2c", help="a FedRefine mode (listed below; default "
                   "c2c)")
    q.add_argument("--private", action="store_true", help="transmitters see a rephrased prompt")
    q.add_argument("--order", default="parallel", help="how multi combines transmitters "
                   "(listed below; default parallel)")
    q.add_argument("--rounds", type=int, default=1, help="co-c2c exchanges")
    q.add_argument("--choices", default="", help="'|'-separated answer choices: score them "
                   "instead of generating")
    q.add_argument("--max-new-tokens", type=int, default=24)
    q.add_argument("--peer", action="append", default=[], help="URL of a remote transmitter "
                   "(`refine serve`); its fuser comes from --registry (a folder or URL)")
    q.add_argument("--quant", default="bf16", help="how remote transmitters send their "
                   "caches (listed below; default bf16)")
    q.add_argument("--timeout", type=float, default=30.0, help="seconds before a peer is "
                   "skipped")
    q.add_argument("--ca", default="", help="CA bundle of peers behind a private TLS CA")
    add_runtime_options(q)
    add_option_config(q)
    q.set_defaults(func=_ask)


def add_serve(rsub: argparse._SubParsersAction) -> None:
    q = rsub.add_parser("serve", help="serve one model as a network peer",
                        description="Serve one model over HTTP (FastAPI on uvicorn): /prefill "
                        "returns its cache of a text, /answer answers with the caches in the "
                        "request, /ask answers helped by the --peer services it may consult. "
                        "Fusers come from --registry (a folder or a registry URL).",
                        formatter_class=HelpFormatter, epilog=_choices_text("quant"))
    q.add_argument("--model", required=True, help="a folder, a hub id, or sandbox:NAME")
    q.add_argument("--registry", default="", help="fuser registry folder or URL (needed to "
                   "answer with caches)")
    q.add_argument("--peer", action="append", default=[], help="URL of a peer this receiver "
                   "may ask for help (/ask); repeat for several")
    q.add_argument("--quant", default="bf16", help="how this receiver asks its peers to "
                   "send caches (listed below; default bf16)")
    _service_options(q, 8701)
    add_runtime_options(q)
    keys, quants = q.epilog, _choices_text("quant")
    q.epilog = lambda: f"{quants()}\n\n{keys()}"   # both built only when help is shown
    q.set_defaults(func=_serve)


def add_registry(rsub: argparse._SubParsersAction) -> None:
    q = rsub.add_parser("registry", help="serve a fuser registry folder",
                        description="Serve REGISTRY/<T>--to--<R>/ fusers (written by "
                        "`refine pretrain-fuser`) over HTTP: GET /pairs, GET "
                        "/fusers/<T>/<R> (safetensors).")
    q.add_argument("--folder", default="fusers", type=non_empty,
                   help="registry folder (default: fusers)")
    _service_options(q, 8700)
    q.set_defaults(func=_registry)


def _service_options(q: argparse.ArgumentParser, port: int) -> None:
    q.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                   "loopback; 0.0.0.0 for every interface)")
    q.add_argument("--port", type=int, default=port)
    q.add_argument("--tls-cert", default="", help="TLS certificate (PEM); with --tls-key")
    q.add_argument("--tls-key", default="")
    q.add_argument("--max-payload-mb", type=float, default=None, help="largest request body "
                   "(default 64; the setting max_payload_bytes)")
    q.add_argument("--timeout", type=float, default=None, help="seconds before a peer is "
                   "skipped (default 30; the setting peer_timeout)")
    # The limits (choices, tokens, requests in flight): --config/--set, listed in --help.
    add_config_options(q, "plasticlm.refine.wire.serving:ServiceConfig")
    q.add_argument("--ca", default="", help="CA bundle of peers behind a private TLS CA")


def _choices(args) -> list[str]:
    return [c for c in args.choices.split("|") if c.strip()]


def _token() -> str | None:
    # From the environment, not argv: a command line is visible to every user of the machine.
    # Set but empty or short is refused, never read as "no token".
    from plasticlm.refine.wire.serving import check_token

    token = os.environ.get("PLASTICLM_TOKEN")
    check_token(token, "127.0.0.1")
    return token


def _service_config(args, **kw):
    import dataclasses
    from pathlib import Path

    from plasticlm.errors import PlasticError
    from plasticlm.refine.wire.quant import QUANTS
    from plasticlm.refine.wire.serving import ServiceConfig, check_listen, check_token, check_url

    QUANTS.check(getattr(args, "quant", "bf16"))
    if args.max_payload_mb is not None and not 0 < args.max_payload_mb < float("inf"):
        raise PlasticError(f"--max-payload-mb must be > 0 and finite, not {args.max_payload_mb}")
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        raise PlasticError(f"--timeout must be > 0 seconds and finite, not {args.timeout}")
    cfg = load_from_args(ServiceConfig, args)
    if cfg.token is not None:
        raise PlasticError("the token is read from $PLASTICLM_TOKEN only (a command line or "
                           "a file would show it to others)")
    token = _token()
    check_token(token, args.host)
    check_listen(args.host, args.port, args.tls_cert, args.tls_key)
    if args.ca:   # read now, not at the first peer call
        import ssl

        try:
            ssl.create_default_context(cafile=args.ca)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise PlasticError(f"--ca {args.ca} is not a readable PEM CA bundle ({e})") from None
    for url in getattr(args, "peer", None) or []:
        check_url(url, "--peer")
    if args.ca and not Path(args.ca).is_file():
        raise PlasticError(f"--ca {args.ca}: no such file (a PEM bundle of the peers' CA)")
    if args.max_payload_mb is not None:
        kw["max_payload_bytes"] = int(args.max_payload_mb * 2**20)
    if args.timeout is not None:
        kw["peer_timeout"] = args.timeout
    return dataclasses.replace(cfg, token=token, verify=args.ca or cfg.verify, **kw)


def _serve(args) -> int:
    from plasticlm.refine.peer import load_peer
    from plasticlm.refine.wire.remote import FuserSource
    from plasticlm.refine.wire.service import peer_app
    from plasticlm.refine.wire.serving import serve

    config = _service_config(args, peers=tuple(args.peer), quant=args.quant)
    fusers = FuserSource(args.registry, config.token, config.peer_timeout, config.verify,
                         config.connect_timeout) if args.registry else None
    peer = load_peer(args.model)
    scheme = "https" if args.tls_cert else "http"
    print(f"peer {peer.name} on {scheme}://{args.host}:{args.port}"
          f"{' (token required)' if config.token else ''}", flush=True)
    serve(peer_app(peer, fusers, config), args.host, args.port, args.tls_cert, args.tls_key)
    return 0


def _registry(args) -> int:
    from pathlib import Path

    from plasticlm.errors import PlasticError
    from plasticlm.refine.wire.fuser_registry import registered_pairs
    from plasticlm.refine.wire.service import registry_app
    from plasticlm.refine.wire.serving import serve

    if not Path(args.folder).is_dir():
        raise PlasticError(f"registry folder {args.folder} does not exist; fill it with "
                           "`plasticlm refine pretrain-fuser --registry FOLDER`")
    config = _service_config(args)
    scheme = "https" if args.tls_cert else "http"
    print(f"registry of {len(registered_pairs(args.folder))} fusers on "
          f"{scheme}://{args.host}:{args.port}", flush=True)
    serve(registry_app(args.folder, config), args.host, args.port, args.tls_cert, args.tls_key)
    return 0


def _ask_remote_receiver(args) -> int:
    """``--receiver URL``: the receiver's own service answers, asking its configured peers."""
    from plasticlm.refine.wire.remote import call_peer, http_client

    body = {"prompt": args.prompt, "mode": args.mode, "max_new_tokens": args.max_new_tokens,
            "private": args.private, "order": args.order,
            "choices": _choices(args)}
    r = call_peer(http_client(args.timeout * 4, args.ca or True), "POST",
              f"{args.receiver.rstrip('/')}/ask", _token(), json=body)
    print(json.dumps(r.json(), indent=1))
    return 0


def _ask(args) -> int:
    from plasticlm.config import from_dict
    from plasticlm.errors import PlasticError
    from plasticlm.refine.fedrefine import FedRefine
    from plasticlm.refine.fusers.fuser import Fuser
    from plasticlm.refine.link import Link
    from plasticlm.refine.modes import MODES, RefineConfig
    from plasticlm.refine.peer import load_peer

    MODES.check(args.mode)
    if args.receiver.startswith(("http://", "https://")):
        return _ask_remote_receiver(args)
    refine = from_dict(RefineConfig, {"private": args.private, "order": args.order,
                                      "rounds": args.rounds})
    skipped: list[str] = []
    if args.registry or args.peer:
        from plasticlm.refine.wire.quant import QUANTS
        from plasticlm.refine.wire.remote import FuserSource, PeerUnavailable, RemotePeer

        QUANTS.check(args.quant)
        if not args.registry and MODES[args.mode].reads_caches:
            raise PlasticError("remote transmitters' fusers come from a registry: give "
                               "--registry FOLDER_OR_URL (or use --mode t2t)")
        receiver = load_peer(args.receiver)
        fusers = FuserSource(args.registry, _token(), args.timeout, args.ca or True) \
            if args.registry else None
        peers = [load_peer(t) for t in args.transmitter]
        for url in args.peer:
            remote = RemotePeer(url, _token(), args.timeout, args.quant, args.ca or True)
            try:
                peers.append(remote.connect())   # a peer that is down is skipped and named
            except PeerUnavailable as e:
                skipped.append(str(e))
        links = [Link(p, fusers.fuser(p.name, receiver.name) if fusers else None)
                 for p in peers]
        if not links and skipped and MODES[args.mode].uses_links:
            raise PlasticError(f"mode {args.mode!r} needs a transmitter, and none given could "
                               "be reached: " + "; ".join(skipped))
    else:
        if len(args.transmitter) != len(args.fuser):
            raise PlasticError(f"{len(args.transmitter)} --transmitter but {len(args.fuser)} "
                               "--fuser: give one fuser folder per transmitter, in the same "
                               "order (or --registry)")
        receiver = load_peer(args.receiver)
        links = [Link(load_peer(t), Fuser.from_pretrained(f))
                 for t, f in zip(args.transmitter, args.fuser)]
    reverse = Fuser.from_pretrained(args.reverse_fuser) if args.reverse_fuser else None
    fr = FedRefine(receiver, links, refine, reverse_fuser=reverse)
    if args.choices:
        choices = _choices(args)
        s = fr.score(args.prompt, choices, args.mode)
        out = {"mode": args.mode, "choice": choices[s.choice], "scores": s.scores,
               "ttft_ms": 1000 * s.ttft, "latency_ms": 1000 * s.latency,
               "wire_bytes": s.wire_bytes}
        if s.partner_choice is not None:
            out["partner_choice"] = choices[s.partner_choice]
    else:
        a = fr.ask(args.prompt, args.mode, args.max_new_tokens)
        out = {"mode": args.mode, "answer": a.text, "ttft_ms": 1000 * a.ttft,
               "latency_ms": 1000 * a.latency, "wire_bytes": a.wire_bytes}
        if a.background:
            out["background"] = a.background
        if a.rephrased:
            out["rephrased"] = a.rephrased
        if a.partner_text is not None:
            out["partner_answer"] = a.partner_text
    if args.peer:
        out["took_part"] = [link.peer.name for link in fr.links_for(args.mode)]
        out["skipped"] = skipped
        out["seconds"] = s.seconds if args.choices else a.seconds
    print(json.dumps(out, indent=1))
    return 0
