"""``plasticlm refine``: FedRefine, devices helping each other by exchanging KV caches."""

from __future__ import annotations

import argparse
import json
import os

from plasticlm.cli.options import add_config_options, add_runtime_options, load_from_args
from plasticlm.run_report import write_report


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("refine", help="FedRefine: answer with help from other LLMs' KV caches",
                       description="FedRefine: train fusers between two LLMs, answer with "
                       "transmitters' caches (alone, t2t, c2c, multi, co-c2c), run the "
                       "experiment. Models: a folder, a hub id, or sandbox:NAME / quick:NAME.")
    rsub = p.add_subparsers(dest="refine_command", required=True, metavar="ACTION")

    q = rsub.add_parser("train-fuser", help="train the fuser that carries T's cache into R",
                        description="Train a fuser (transmitter -> receiver), both LLMs frozen, "
                        "on MC questions (answer text as the target); saves safetensors + config.")
    q.add_argument("--receiver", required=True)
    q.add_argument("--transmitter", required=True)
    q.add_argument("--out", required=True, help="fuser folder to write")
    q.add_argument("--mmlu", default="", help="MMLU-layout folder (default: the sandbox "
                   "world's specialist questions of the receiver's preset)")
    q.add_argument("--splits", default="dev,val", help="training splits, comma-separated")
    q.add_argument("--subjects", default="", help="comma-separated subjects (default all)")
    add_config_options(q, "plasticlm.refine.train:FuserTrainConfig")
    add_runtime_options(q)
    q.set_defaults(func=_train_fuser)

    q = rsub.add_parser("pretrain-fuser", help="pre-train a general fuser for one ordered pair "
                        "into a registry", description="Train the fuser transmitter -> receiver "
                        "as C2C pre-trains: both models frozen, on (context, continuation) pairs "
                        "from general text only (the receiver's sandbox world corpus, or "
                        "--corpus), never a task or specialist fact; saves it to "
                        "REGISTRY/<transmitter>--to--<receiver>/ with train_summary.json.")
    q.add_argument("--receiver", required=True)
    q.add_argument("--transmitter", required=True)
    q.add_argument("--registry", default="fusers", help="registry folder (default: fusers)")
    q.add_argument("--corpus", default="", help="plain-text corpus, documents separated by "
                   "<|endoftext|> (default: the sandbox world's general corpus)")
    q.add_argument("--examples", type=int, default=2000, help="general examples to train on")
    add_config_options(q, "plasticlm.refine.train:FuserTrainConfig")
    add_runtime_options(q)
    q.set_defaults(func=_pretrain_fuser)

    q = rsub.add_parser("ask", help="answer a prompt in one mode",
                        description="Answer a prompt with the receiver, helped by transmitters "
                        "through their fusers (one --transmitter/--fuser pair each).")
    q.add_argument("prompt")
    q.add_argument("--receiver", required=True)
    q.add_argument("--transmitter", action="append", default=[])
    q.add_argument("--fuser", action="append", default=[], help="fuser folder, one per "
                   "--transmitter, in the same order")
    q.add_argument("--registry", default="", help="take each transmitter's fuser from this "
                   "registry instead of --fuser")
    q.add_argument("--reverse-fuser", help="receiver -> transmitter fuser (co-c2c)")
    q.add_argument("--mode", default="c2c", choices=("alone", "t2t", "c2c", "multi", "co-c2c"))
    q.add_argument("--private", action="store_true", help="transmitters see a rephrased prompt")
    q.add_argument("--order", default="parallel", choices=("parallel", "sequence"))
    q.add_argument("--rounds", type=int, default=1)
    q.add_argument("--choices", default="", help="'|'-separated answer choices: score them "
                   "instead of generating")
    q.add_argument("--max-new-tokens", type=int, default=24)
    q.add_argument("--peer", action="append", default=[], help="URL of a remote transmitter "
                   "(`refine serve`); its fuser comes from --registry (a folder or URL)")
    q.add_argument("--quant", default="bf16", help="how remote transmitters send their "
                   "caches: float32, bf16, int8 or fp8")
    q.add_argument("--timeout", type=float, default=30.0, help="seconds before a peer is "
                   "skipped")
    q.add_argument("--ca", default="", help="CA bundle of peers behind a private TLS CA")
    add_runtime_options(q)
    q.set_defaults(func=_ask)

    q = rsub.add_parser("serve", help="serve one model as a network peer",
                        description="Serve one model over HTTP (FastAPI on uvicorn): /prefill "
                        "returns its cache of a text, /answer answers with the caches in the "
                        "request, /ask answers helped by the --peer services it may consult. "
                        "Fusers come from --registry (a folder or a registry URL).")
    q.add_argument("--model", required=True, help="a folder, a hub id, or sandbox:NAME")
    q.add_argument("--registry", default="", help="fuser registry folder or URL (needed to "
                   "answer with caches)")
    q.add_argument("--peer", action="append", default=[], help="URL of a peer this receiver "
                   "may ask for help (/ask); repeat for several")
    q.add_argument("--quant", default="bf16", help="how this receiver asks its peers to "
                   "send caches: float32, bf16, int8 or fp8")
    _service_options(q, 8701)
    add_runtime_options(q)
    q.set_defaults(func=_serve)

    q = rsub.add_parser("registry", help="serve a fuser registry folder",
                        description="Serve REGISTRY/<T>--to--<R>/ fusers (written by "
                        "`refine pretrain-fuser`) over HTTP: GET /pairs, GET "
                        "/fusers/<T>/<R> (safetensors).")
    q.add_argument("--folder", default="fusers", help="registry folder (default: fusers)")
    _service_options(q, 8700)
    q.set_defaults(func=_registry)

    q = rsub.add_parser("experiment", help="accuracy, latency and bytes of every mode",
                        description="'modes' (the default): train fusers and measure every "
                        "mode on MC questions; writes report.json, table.md, metrics.jsonl and "
                        "PNG plots. 'transfer': the probe gate and held-out transfer of "
                        "general and task fusers, each beside a control transmitter.")
    q.add_argument("which", nargs="?", default="modes", choices=("modes", "transfer"))
    add_config_options(q, "plasticlm.refine.experiment:ExperimentConfig",
                       "plasticlm.refine.ladder:TransferConfig", quick="refine/transfer-quick")
    add_runtime_options(q)
    q.set_defaults(func=_experiment)


def _service_options(q: argparse.ArgumentParser, port: int) -> None:
    q.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                   "loopback; 0.0.0.0 for every interface)")
    q.add_argument("--port", type=int, default=port)
    q.add_argument("--tls-cert", default="", help="TLS certificate (PEM); with --tls-key")
    q.add_argument("--tls-key", default="")
    q.add_argument("--max-payload-mb", type=float, default=64.0, help="largest request body")
    q.add_argument("--timeout", type=float, default=30.0, help="seconds before a peer is "
                   "skipped")
    q.add_argument("--ca", default="", help="CA bundle of peers behind a private TLS CA")


def _choices(args) -> list[str]:
    return [c for c in args.choices.split("|") if c.strip()]


def _token() -> str | None:
    # From the environment, not argv: a command line is visible to every user of the machine.
    return os.environ.get("PLASTICLM_TOKEN") or None


def _service_config(args, **kw):
    from pathlib import Path

    from plasticlm.errors import PlasticError
    from plasticlm.refine.codec import check_quant
    from plasticlm.refine.service import ServiceConfig, check_listen, check_url

    check_quant(getattr(args, "quant", "bf16"))
    if not args.max_payload_mb > 0:
        raise PlasticError(f"--max-payload-mb must be > 0, not {args.max_payload_mb}")
    if not args.timeout > 0:
        raise PlasticError(f"--timeout must be > 0 seconds, not {args.timeout}")
    check_listen(args.host, args.port, args.tls_cert, args.tls_key)
    for url in getattr(args, "peer", None) or []:
        check_url(url, "--peer")
    if args.ca and not Path(args.ca).is_file():
        raise PlasticError(f"--ca {args.ca}: no such file (a PEM bundle of the peers' CA)")
    return ServiceConfig(token=_token(), max_payload_bytes=int(args.max_payload_mb * 2**20),
                         peer_timeout=args.timeout, verify=args.ca or True, **kw)


def _serve(args) -> int:
    from plasticlm.refine.peer import load_peer
    from plasticlm.refine.remote import FuserSource
    from plasticlm.refine.service import peer_app, serve

    config = _service_config(args, peers=args.peer, quant=args.quant)
    fusers = FuserSource(args.registry, config.token, args.timeout, config.verify) \
        if args.registry else None
    peer = load_peer(args.model)
    scheme = "https" if args.tls_cert else "http"
    print(f"peer {peer.name} on {scheme}://{args.host}:{args.port}"
          f"{' (token required)' if config.token else ''}", flush=True)
    serve(peer_app(peer, fusers, config), args.host, args.port, args.tls_cert, args.tls_key)
    return 0


def _registry(args) -> int:
    from pathlib import Path

    from plasticlm.errors import PlasticError
    from plasticlm.refine.registry import registered_pairs
    from plasticlm.refine.service import registry_app, serve

    if not Path(args.folder).is_dir():
        raise PlasticError(f"registry folder {args.folder} does not exist; fill it with "
                           "`plasticlm refine pretrain-fuser --registry FOLDER`")
    config = _service_config(args)
    scheme = "https" if args.tls_cert else "http"
    print(f"registry of {len(registered_pairs(args.folder))} fusers on "
          f"{scheme}://{args.host}:{args.port}", flush=True)
    serve(registry_app(args.folder, config), args.host, args.port, args.tls_cert, args.tls_key)
    return 0


def _split(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _train_fuser(args) -> int:
    from dataclasses import asdict
    from pathlib import Path

    from plasticlm.refine.examples import make_examples
    from plasticlm.refine.experiment import ExperimentConfig, load_questions
    from plasticlm.refine.peer import load_peer
    from plasticlm.refine.train import FuserTrainConfig, train_fuser

    cfg = load_from_args(FuserTrainConfig, args)
    receiver, transmitter = load_peer(args.receiver), load_peer(args.transmitter)
    train_q, _, prompt_fn = load_questions(ExperimentConfig(
        receiver=args.receiver, mmlu=args.mmlu, subjects=tuple(_split(args.subjects)),
        train_splits=tuple(_split(args.splits))))
    examples = make_examples(train_q, prompt_fn, private=cfg.private)
    fuser, losses = train_fuser(receiver, transmitter, examples, cfg)
    out = fuser.save_pretrained(args.out)
    r_params = sum(p.numel() for p in receiver.model.parameters())
    summary = {"out": str(Path(out)), "examples": len(examples), "steps": len(losses),
               "first_loss": round(losses[0], 4),
               "last_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
               "fuser_parameters": fuser.num_parameters(),
               "ratio_to_receiver": round(fuser.num_parameters() / r_params, 5),
               "config": asdict(cfg)}
    (Path(out) / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


def _pretrain_fuser(args) -> int:
    from dataclasses import asdict

    from plasticlm.data.corpus import load_text_corpus
    from plasticlm.errors import PlasticError
    from plasticlm.refine.examples import general_examples
    from plasticlm.refine.experiment import sandbox_world_of
    from plasticlm.refine.peer import load_peer
    from plasticlm.refine.registry import pair_folder
    from plasticlm.refine.train import FuserTrainConfig, loss_summary, train_fuser

    cfg = load_from_args(FuserTrainConfig, args)
    if args.examples < 1:
        raise PlasticError(f"--examples must be >= 1, not {args.examples}")
    corpus = args.corpus or sandbox_world_of(args.receiver) / "corpus" / "train.txt"
    examples = general_examples([d.text for d in load_text_corpus(corpus)], args.examples,
                                seed=cfg.seed)
    if not examples:
        raise PlasticError(f"{corpus} gives no general examples (it needs documents of two or "
                           "more sentences, or Q/A lines)")
    receiver, transmitter = load_peer(args.receiver), load_peer(args.transmitter)
    fuser, losses = train_fuser(receiver, transmitter, examples, cfg)
    folder = fuser.save_pretrained(pair_folder(args.registry, transmitter.name, receiver.name))
    summary = {"receiver": args.receiver, "transmitter": args.transmitter, "corpus": str(corpus),
               "examples": len(examples), **loss_summary(losses), "gates_on": fuser.gates_on(),
               "config": asdict(cfg)}
    (folder / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))
    print(f"fuser: {folder}")
    return 0


def _ask_remote_receiver(args) -> int:
    """``--receiver URL``: the receiver's own service answers, asking its configured peers."""
    from plasticlm.refine.remote import call_peer, http_client

    body = {"prompt": args.prompt, "mode": args.mode, "max_new_tokens": args.max_new_tokens,
            "private": args.private, "order": args.order,
            "choices": _choices(args)}
    r = call_peer(http_client(args.timeout * 4, args.ca or True), "POST",
              f"{args.receiver.rstrip('/')}/ask", _token(), json=body)
    print(json.dumps(r.json(), indent=1))
    return 0


def _ask(args) -> int:
    from plasticlm.errors import PlasticError
    from plasticlm.refine.fuser import Fuser
    from plasticlm.refine.modes import FedRefine, Link, RefineConfig
    from plasticlm.refine.peer import load_peer

    if args.receiver.startswith(("http://", "https://")):
        return _ask_remote_receiver(args)
    skipped: list[str] = []
    if args.registry or args.peer:
        from plasticlm.refine.codec import check_quant
        from plasticlm.refine.remote import FuserSource, PeerUnavailable, RemotePeer

        check_quant(args.quant)
        if not args.registry and args.mode != "t2t":
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
    else:
        if len(args.transmitter) != len(args.fuser):
            raise PlasticError(f"{len(args.transmitter)} --transmitter but {len(args.fuser)} "
                               "--fuser: give one fuser folder per transmitter, in the same "
                               "order (or --registry)")
        receiver = load_peer(args.receiver)
        links = [Link(load_peer(t), Fuser.from_pretrained(f))
                 for t, f in zip(args.transmitter, args.fuser)]
    reverse = Fuser.from_pretrained(args.reverse_fuser) if args.reverse_fuser else None
    fr = FedRefine(receiver, links, RefineConfig(private=args.private, order=args.order,
                                                 rounds=args.rounds), reverse_fuser=reverse)
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


def _experiment(args) -> int:
    from plasticlm.errors import PlasticError

    if args.which == "transfer":
        from plasticlm.refine.ladder import TransferConfig
        from plasticlm.refine.report import transfer_table
        from plasticlm.refine.transfer import run_transfer

        cfg = load_from_args(TransferConfig, args)
        print(transfer_table(run_transfer(cfg)))
        print(f"report: {write_report(cfg.out)[0]}")
        return 0
    from plasticlm.refine.experiment import ExperimentConfig, run_experiment
    from plasticlm.refine.report import markdown_table

    if args.quick:
        raise PlasticError("--quick is the transfer experiment's preset; for modes give sizes "
                           "with --set (e.g. --set receiver=quick:receiver)")
    cfg = load_from_args(ExperimentConfig, args)
    report = run_experiment(cfg)

    print(markdown_table(report))
    print(f"report: {write_report(report['out'])[0]}")
    return 0
