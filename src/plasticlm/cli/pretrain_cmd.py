"""``plasticlm models pretrain``: the sandbox model family, or one model on any text."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from plasticlm.cli.options import THREADS, add_config_options, load_from_args
from plasticlm.errors import PlasticError
from plasticlm.outputs import prepare_output


def add_pretrain_parser(models_subparsers: argparse._SubParsersAction) -> None:
    """Add the ``pretrain`` verb to ``plasticlm models``."""
    q = models_subparsers.add_parser(
        "pretrain", help="pre-train the sandbox models, or one model on a text file",
        description="--preset NAME trains the preset's world, tokenizers and models into the "
        "cache (cache_home()/models/sandbox[-NAME]-vN), prints the probe table with 95%% "
        "intervals and writes report.json; a killed run resumes where it stopped; --text FILE --out DIR "
        "trains a tokenizer and one model on a plain-text corpus.")
    q.add_argument("--preset", default=None, help="sandbox (v2, the default family: 13-16 min on 2 idle cores the first "
                   "time), sandbox-v3 (a family that reads its context: hours; resumable), "
                   "quick or quick-v3 (seconds-long miniatures)")
    q.add_argument("--text", default=None, help="plain-text corpus, documents separated by "
                   "<|endoftext|>")
    q.add_argument("--out", default=None, help="output folder (required with --text)")
    q.add_argument("--force", action="store_true", help="retrain even when the models exist")
    q.add_argument("--ship", action="store_true", help="then write the family into the package "
                   "(src/plasticlm/sandbox/family/PRESET) with its SHA-256 manifest: what a "
                   "fresh clone installs instead of pre-training (maintainers)")
    q.add_argument("--threads", type=THREADS, default=None, help="torch CPU threads")
    q.add_argument("--progress", action="store_true", help="with --preset: print where its "
                   "pre-training stands (members done, the step and losses of the one in "
                   "training) without training; a running build is not touched")
    q.add_argument("--probe", action="store_true", help="with --progress: also probe the "
                   "checkpoint in training (reading probes and held-out MC, 80 items each)")
    add_config_options(q, "plasticlm.sandbox.text:TextPretrainConfig")
    q.set_defaults(func=_pretrain)


def _pretrain(args) -> int:
    # heavy: imported when the command runs, not when the parser is built
    from plasticlm.runtime import set_threads
    from plasticlm.sandbox import (
        TextPretrainConfig,
        get_preset,
        preset_dir,
        pretrain_preset,
        pretrain_text,
        probe_table,
    )
    from plasticlm.sandbox.pretrain import family_current, member_key
    from plasticlm.sandbox.reading_probes import reading_table
    from plasticlm.sandbox.shipped import read_manifest, write_shipped

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
    if args.progress or args.probe:
        if not args.progress or args.preset is None:
            raise PlasticError("--probe goes with --progress, and --progress with --preset")
        from plasticlm.sandbox.progress import build_progress
        print(json.dumps(build_progress(args.preset, probe=args.probe), indent=1))
        return 0
    if args.ship and args.out:
        raise PlasticError("--ship writes the family of the cache; leave out --out")
    if args.out:
        prepare_output(args.out, "model", hint="give another --out")
    root = Path(args.out or preset_dir(args.preset))
    # --ship of a family just trained here ships it as it is (its report keeps its times)
    if not (args.ship and not args.force and family_current(args.preset, root)
            and read_manifest(root) is None):
        # pre-trains here: a shipped family installed in the cache is rebuilt, not reused
        pretrain_preset(args.preset, args.out, reuse=not args.force)
    report = json.loads((root / "report.json").read_text())
    if args.ship:
        p = get_preset(args.preset)
        dest = write_shipped(args.preset, root, {m.name: member_key(p, m) for m in p.models},
                             "plasticlm " + " ".join(sys.argv[1:]), report)
        print(f"shipped copy and manifest.json in {dest}")
    print(probe_table(report))
    reading = reading_table(report)
    if reading:
        print("\n" + reading)
    print(f"sandbox v{report['sandbox_version']}: {report['total_seconds']:.0f} s wall, "
          f"{report['total_cpu_seconds']:.0f} s CPU on {report['torch_threads']} threads "
          "(models already trained are loaded, not timed again)")
    print(f"models, world, report.json and probes.md in {root}")
    return 0
