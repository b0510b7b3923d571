"""``plasticlm models pretrain``: the sandbox model family, or one model on any text."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from plasticlm.cli.options import THREADS, add_config_options, load_from_args
from plasticlm.errors import PlasticError
from plasticlm.outputs import prepare_output


def add_pretrain_parser(models_subparsers: argparse._SubParsersAction) -> None:
    """Add the ``pretrain`` verb to ``plasticlm models``."""
    q = models_subparsers.add_parser(
        "pretrain", help="pre-train the sandbox models, or one model on a text file",
        description="--preset NAME trains the preset's world, tokenizers and models into the "
        "cache (cache_home()/models/sandbox[-NAME]-v2), prints the probe table with 95%% "
        "intervals and writes report.json; a killed run resumes where it stopped; --text FILE --out DIR "
        "trains a tokenizer and one model on a plain-text corpus.")
    q.add_argument("--preset", default=None, help="sandbox (v2, 13-16 min on 2 idle cores the first time) or quick")
    q.add_argument("--text", default=None, help="plain-text corpus, documents separated by "
                   "<|endoftext|>")
    q.add_argument("--out", default=None, help="output folder (required with --text)")
    q.add_argument("--force", action="store_true", help="retrain even when the models exist")
    q.add_argument("--threads", type=THREADS, default=None, help="torch CPU threads")
    add_config_options(q, "plasticlm.sandbox.text:TextPretrainConfig")
    q.set_defaults(func=_pretrain)


def _pretrain(args) -> int:
    # heavy: imported when the command runs, not when the parser is built
    from plasticlm.runtime import set_threads
    from plasticlm.sandbox import (
        TextPretrainConfig,
        ensure_sandbox_models,
        preset_dir,
        pretrain_preset,
        pretrain_text,
        probe_table,
    )

    if args.threads:
        set_threads(args.threads)
    if (args.preset is None) == (args.text is None):
        raise PlasticError("give exactly one of --preset NAME or --text FILE")
    if args.text is not None:
        if not args.out:
            raise PlasticError("--text needs --out DIR for the trained model folder")
        cfg = load_from_args(TextPretrainConfig, args)
        report = pretrain_text(args.text, args.out, cfg)
        print(json.dumps({k: report[k] for k in ("train_seconds", "first_loss", "last_loss",
                                                 "valid_loss", "unigram_loss")}))
        print(f"model and tokenizer in {args.out} (report: pretrain_report.json)")
        return 0
    if args.out:
        prepare_output(args.out, "model", hint="give another --out")
    if args.out or args.force:
        pretrain_preset(args.preset, args.out, reuse=not args.force)
    else:
        ensure_sandbox_models(args.preset)
    root = Path(args.out or preset_dir(args.preset))
    report = json.loads((root / "report.json").read_text())
    print(probe_table(report))
    print(f"sandbox v{report['sandbox_version']}: {report['total_seconds']:.0f} s wall, "
          f"{report['total_cpu_seconds']:.0f} s CPU on {report['torch_threads']} threads "
          "(models already trained are loaded, not timed again)")
    print(f"models, world, report.json and probes.md in {root}")
    return 0
