"""``plasticlm refine``: FedRefine, devices helping each other by exchanging KV caches.
Training fusers and the experiments are here; ``ask``, ``serve`` and ``registry`` in
:mod:`plasticlm.cli.refine_ask`."""

from __future__ import annotations

import argparse
import json
import sys

from plasticlm.cli.options import SIZE, add_config_options, add_runtime_options, load_from_args
from plasticlm.cli.refine_ask import add_ask, add_registry, add_serve
from plasticlm.outputs import prepare_output
from plasticlm.run_report import write_report


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("refine", help="FedRefine: answer with help from other LLMs' KV caches",
                       description="FedRefine: train fusers between two LLMs, answer with "
                       "transmitters' caches in any FedRefine mode (`refine ask --help` lists "
                       "them), run the experiments. Models: a folder, a hub id, or "
                       "sandbox:NAME / quick:NAME.")
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
    q.add_argument("--teacher", default="", help="objective cache / answer+cache: the model "
                   "whose cache the fuser learns to reproduce (the receiver's architecture and "
                   "tokenizer, knowing what the transmitter knows)")
    add_config_options(q, "plasticlm.refine.fusers.train:FuserTrainConfig")
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
    q.add_argument("--examples", type=SIZE, default=2000, help="general examples to train on")
    q.add_argument("--teacher", default="", help="objective cache / answer+cache: the model "
                   "whose cache the fuser learns to reproduce (the receiver's architecture and "
                   "tokenizer, knowing what the transmitter knows)")
    add_config_options(q, "plasticlm.refine.fusers.train:FuserTrainConfig")
    add_runtime_options(q)
    q.set_defaults(func=_pretrain_fuser, output_args=("registry",))

    add_ask(rsub)
    add_serve(rsub)
    add_registry(rsub)

    q = rsub.add_parser("experiment", help="accuracy, latency and bytes of every mode",
                        description="'modes' (the default): train fusers and measure every "
                        "mode on MC questions; writes report.json, table.md, metrics.jsonl and "
                        "PNG plots. 'transfer': the probe gate and held-out transfer of "
                        "general and task fusers, each beside a control transmitter. "
                        "'ladder': rungs a-g from the hand-over ceiling down to the "
                        "heterogeneous specialist, each beside its control, with the "
                        "fraction of the ceiling it reaches.")
    q.add_argument("which", nargs="?", default="modes", choices=("modes", "transfer", "ladder"))
    q.add_argument("--ship-oracle", action="store_true", help="ladder: then write the oracle "
                   "taught in this run into the package (src/plasticlm/experiments/refine/shipped/oracle) "
                   "with its SHA-256 manifest, what later runs take instead of teaching "
                   "(maintainers; needs --set shipped_taught=false)")
    add_config_options(q, "plasticlm.experiments.refine.experiment:ExperimentConfig",
                       "plasticlm.experiments.refine.ladder:TransferConfig",
                       "plasticlm.experiments.refine.rungs:LadderConfig", quick="refine/transfer-quick")
    add_runtime_options(q)
    q.set_defaults(func=_experiment)


def _split(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _train_fuser(args) -> int:
    from pathlib import Path

    from plasticlm.config import from_dict, to_dict
    from plasticlm.experiments.refine.experiment import ExperimentConfig, load_questions
    from plasticlm.refine.examples import make_examples
    from plasticlm.refine.fusers.train import FuserTrainConfig, train_fuser
    from plasticlm.refine.peer import load_peer

    cfg = load_from_args(FuserTrainConfig, args)
    receiver, transmitter = load_peer(args.receiver), load_peer(args.transmitter)
    train_q, _, prompt_fn = load_questions(from_dict(ExperimentConfig, {
        "receiver": args.receiver, "mmlu": args.mmlu, "subjects": _split(args.subjects),
        "train_splits": _split(args.splits)}))
    examples = make_examples(train_q, prompt_fn, private=cfg.private)
    teacher = load_peer(args.teacher) if args.teacher else None
    fuser, losses = train_fuser(receiver, transmitter, examples, cfg, teacher=teacher)
    out = fuser.save_pretrained(prepare_output(args.out, "fuser", hint="give another --out"))
    r_params = sum(p.numel() for p in receiver.model.parameters())
    summary = {"out": str(Path(out)), "examples": len(examples), "steps": len(losses),
               "first_loss": round(losses[0], 4),
               "last_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
               "fuser_parameters": fuser.num_parameters(),
               "ratio_to_receiver": round(fuser.num_parameters() / r_params, 5),
               "config": to_dict(cfg)}
    (Path(out) / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


def _pretrain_fuser(args) -> int:
    from plasticlm.config import to_dict
    from plasticlm.data.corpus import load_text_corpus
    from plasticlm.errors import PlasticError
    from plasticlm.experiments.refine.experiment import sandbox_world_of
    from plasticlm.refine.examples import general_examples
    from plasticlm.refine.fusers.train import FuserTrainConfig, loss_summary, train_fuser
    from plasticlm.refine.peer import load_peer
    from plasticlm.refine.wire.fuser_registry import pair_folder

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
    teacher = load_peer(args.teacher) if args.teacher else None
    fuser, losses = train_fuser(receiver, transmitter, examples, cfg, teacher=teacher)
    prepare_output(args.registry, "registry", hint="give another --registry")
    folder = fuser.save_pretrained(pair_folder(args.registry, transmitter.name, receiver.name))
    summary = {"receiver": args.receiver, "transmitter": args.transmitter, "corpus": str(corpus),
               "examples": len(examples), **loss_summary(losses), "gates_on": fuser.gates_on(),
               "config": to_dict(cfg)}
    (folder / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))
    print(f"fuser: {folder}")
    return 0


def _experiment(args) -> int:
    from plasticlm.errors import PlasticError

    if args.ship_oracle and args.which != "ladder":
        raise PlasticError("--ship-oracle belongs to the ladder (plasticlm refine experiment "
                           "ladder)")
    if args.which == "ladder":
        from plasticlm.experiments.refine.ladder_table import ladder_table, run_ladder
        from plasticlm.experiments.refine.rungs import LadderConfig

        args.quick_preset = "refine/ladder-quick"
        cfg = load_from_args(LadderConfig, args)
        if args.ship_oracle and (cfg.shipped_taught or cfg.receiver != "sandbox:receiver"):
            raise PlasticError("--ship-oracle ships the sandbox receiver's oracle taught here: "
                               "give --set shipped_taught=false and no other receiver (and "
                               "not --quick)")
        if args.ship_oracle:
            from plasticlm.experiments.refine.shipped_taught import (
                SHIPPED_TAUGHT,
                in_source_checkout,
            )

            if not in_source_checkout():
                raise PlasticError(f"--ship-oracle writes into a source checkout's package "
                                   f"folder; {SHIPPED_TAUGHT} is an installed package")
        print(ladder_table(run_ladder(cfg)))
        if args.ship_oracle:
            from pathlib import Path

            from plasticlm.experiments.refine.shipped_taught import (
                weights_sha256,
                write_shipped_taught,
            )
            from plasticlm.refine.peer import resolve_model

            base = weights_sha256(Path(resolve_model(cfg.receiver)[1]))
            if base is None:
                raise PlasticError(f"the receiver {cfg.receiver!r} is not a local model "
                                   "folder: only a local oracle's base can be hashed")
            dest = write_shipped_taught(Path(cfg.out) / "taught" / "oracle", base,
                                        "plasticlm " + " ".join(sys.argv[1:]))
            print(f"shipped oracle and manifest.json in {dest}")
        print(f"report: {write_report(cfg.out)[0]}")
        return 0
    if args.which == "transfer":
        from plasticlm.experiments.refine.ladder import TransferConfig
        from plasticlm.experiments.refine.transfer import run_transfer
        from plasticlm.refine.report import transfer_table

        cfg = load_from_args(TransferConfig, args)
        print(transfer_table(run_transfer(cfg)))
        print(f"report: {write_report(cfg.out)[0]}")
        return 0
    from plasticlm.experiments.refine.experiment import ExperimentConfig, run_experiment
    from plasticlm.refine.report import markdown_table

    if args.quick:
        raise PlasticError("--quick is the transfer experiment's preset; for modes give sizes "
                           "with --set (e.g. --set receiver=quick:receiver)")
    cfg = load_from_args(ExperimentConfig, args)
    report = run_experiment(cfg)

    print(markdown_table(report))
    print(f"report: {write_report(report['out'])[0]}")
    return 0
