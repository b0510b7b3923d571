"""``plasticlm refine``: FedRefine, devices helping each other by exchanging KV caches."""

from __future__ import annotations

import argparse
import json


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
    q.add_argument("--config", help="TOML/YAML/JSON with FuserTrainConfig fields")
    q.add_argument("overrides", nargs="*", help="key=value (rank=16 mode=prefix private=true)")
    q.set_defaults(func=_train_fuser)

    q = rsub.add_parser("ask", help="answer a prompt in one mode",
                        description="Answer a prompt with the receiver, helped by transmitters "
                        "through their fusers (one --transmitter/--fuser pair each).")
    q.add_argument("prompt")
    q.add_argument("--receiver", required=True)
    q.add_argument("--transmitter", action="append", default=[])
    q.add_argument("--fuser", action="append", default=[], help="fuser folder, one per "
                   "--transmitter, in the same order")
    q.add_argument("--reverse-fuser", help="receiver -> transmitter fuser (co-c2c)")
    q.add_argument("--mode", default="c2c", choices=("alone", "t2t", "c2c", "multi", "co-c2c"))
    q.add_argument("--private", action="store_true", help="transmitters see a rephrased prompt")
    q.add_argument("--order", default="parallel", choices=("parallel", "sequence"))
    q.add_argument("--rounds", type=int, default=1)
    q.add_argument("--choices", default="", help="'|'-separated answer choices: score them "
                   "instead of generating")
    q.add_argument("--max-new-tokens", type=int, default=24)
    q.set_defaults(func=_ask)

    q = rsub.add_parser("experiment", help="accuracy, latency and bytes of every mode",
                        description="'modes' (the default): train fusers and measure every "
                        "mode on MC questions; writes report.json, table.md, metrics.jsonl and "
                        "PNG plots. 'transfer': the probe gate and held-out transfer of "
                        "general and task fusers, each beside a control transmitter.")
    q.add_argument("--config", help="TOML/YAML/JSON with ExperimentConfig (modes) or "
                   "TransferConfig (transfer) fields")
    q.add_argument("--quick", action="store_true", help="transfer: a smoke test on the "
                   "quick preset in about a minute")
    q.add_argument("overrides", nargs="*",
                   help="[modes|transfer] then key=value, e.g. receiver=quick:receiver "
                   "fuser.epochs=2 out=runs/x")
    q.set_defaults(func=_experiment)


def _split(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _train_fuser(args) -> int:
    from dataclasses import asdict
    from pathlib import Path

    from plasticlm.config import load_config
    from plasticlm.refine.examples import make_examples
    from plasticlm.refine.experiment import ExperimentConfig, load_questions
    from plasticlm.refine.peer import load_peer
    from plasticlm.refine.train import FuserTrainConfig, train_fuser

    cfg = load_config(FuserTrainConfig, args.config, args.overrides)
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


def _ask(args) -> int:
    from plasticlm.errors import PlasticError
    from plasticlm.refine.fuser import Fuser
    from plasticlm.refine.modes import FedRefine, Link, RefineConfig
    from plasticlm.refine.peer import load_peer

    if len(args.transmitter) != len(args.fuser):
        raise PlasticError(f"{len(args.transmitter)} --transmitter but {len(args.fuser)} --fuser: "
                           "give one fuser folder per transmitter, in the same order")
    receiver = load_peer(args.receiver)
    links = [Link(load_peer(t), Fuser.from_pretrained(f))
             for t, f in zip(args.transmitter, args.fuser)]
    reverse = Fuser.from_pretrained(args.reverse_fuser) if args.reverse_fuser else None
    fr = FedRefine(receiver, links, RefineConfig(private=args.private, order=args.order,
                                                 rounds=args.rounds), reverse_fuser=reverse)
    if args.choices:
        choices = [c for c in args.choices.split("|") if c.strip()]
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
    print(json.dumps(out, indent=1))
    return 0


QUICK_TRANSFER = ["receiver=quick:receiver", "specialist=quick:specialist",
                  "control=quick:transmitter-llama", "general_examples=32", "seeds=1",
                  "max_eval=12", "fuser.epochs=1", "fuser.hidden=16", "task_epochs=1",
                  "t2t_max_new_tokens=2", "teach_steps=30", "inversion_texts=16",
                  'parties=["quick:transmitter-llama","quick:receiver"]',
                  "out=runs/refine-transfer-quick"]


def _experiment(args) -> int:
    from plasticlm.config import load_config
    from plasticlm.errors import PlasticError
    from plasticlm.refine.experiment import ExperimentConfig, run_experiment

    overrides = list(args.overrides)
    name = overrides.pop(0) if overrides and "=" not in overrides[0] else "modes"
    if name not in ("modes", "transfer"):
        raise PlasticError(f"unknown refine experiment {name!r}; choose 'modes' or 'transfer'")
    if name == "transfer":
        from plasticlm.refine.report import transfer_table
        from plasticlm.refine.transfer import TransferConfig, run_transfer

        cfg = load_config(TransferConfig, args.config,
                          (QUICK_TRANSFER if args.quick else []) + overrides)
        print(transfer_table(run_transfer(cfg)))
        return 0
    cfg = load_config(ExperimentConfig, args.config, overrides)
    report = run_experiment(cfg)
    from plasticlm.refine.report import markdown_table

    print(markdown_table(report))
    return 0
