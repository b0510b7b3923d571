"""``plasticlm models pretrain``: the sandbox model family, or one model on any text."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_pretrain_parser(models_subparsers: argparse._SubParsersAction) -> None:
    """Add the ``pretrain`` verb to ``plasticlm models``."""
    q = models_subparsers.add_parser(
        "pretrain", help="pre-train the sandbox models, or one model on a text file",
        description="--preset NAME trains the preset's world, tokenizers and models into the "
        "cache (cache_home()/models/sandbox[-NAME]) and writes report.json; --text FILE --out DIR "
        "trains a tokenizer and one model on a plain-text corpus.")
    q.add_argument("--preset", default=None, help="sandbox (about 8.5 min on 2 idle cores) or quick")
    q.add_argument("--text", default=None, help="plain-text corpus, documents separated by "
                   "<|endoftext|>")
    q.add_argument("--out", default=None, help="output folder (required with --text)")
    q.add_argument("--force", action="store_true", help="retrain even when the models exist")
    q.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    q.add_argument("--config", default=None,
                   help="TOML/YAML/JSON of TextPretrainConfig fields (with --text)")
    q.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a TextPretrainConfig field, e.g. steps=500 (with --text)")
    q.set_defaults(func=_pretrain)


def _pretrain(args) -> int:
    import torch

    from plasticlm.errors import PlasticError

    if args.threads:
        torch.set_num_threads(args.threads)
    if (args.preset is None) == (args.text is None):
        raise PlasticError("give exactly one of --preset NAME or --text FILE")
    if args.text is not None:
        from plasticlm.config import load_config
        from plasticlm.data.sandbox import TextPretrainConfig, pretrain_text

        if not args.out:
            raise PlasticError("--text needs --out DIR for the trained model folder")
        cfg = load_config(TextPretrainConfig, args.config, args.overrides)
        report = pretrain_text(args.text, args.out, cfg)
        print(json.dumps({k: report[k] for k in ("train_seconds", "first_loss", "last_loss",
                                                 "valid_loss", "unigram_loss")}))
        print(f"model and tokenizer in {args.out} (report: pretrain_report.json)")
        return 0
    from plasticlm.data.sandbox import ensure_sandbox_models, preset_dir, pretrain_preset

    if args.out or args.force:
        pretrain_preset(args.preset, args.out, reuse=not args.force)
    else:
        ensure_sandbox_models(args.preset)
    root = args.out or preset_dir(args.preset)
    report = json.loads((Path(root) / "report.json").read_text())
    print(summary_table(report))
    print(f"models, world and report.json in {root}")
    return 0


def _acc(table: dict, key: str) -> float:
    return table.get(key, {}).get("accuracy", float("nan"))


def summary_table(report: dict) -> str:
    """One line per model: losses, held-out MC accuracy (all/head/tail), NIAH, seconds."""
    lines = [f"{'model':<20}{'valid':>7}{'unigram':>8}{'mc':>7}{'head':>7}{'tail':>7}"
             f"{'spec':>7}{'train_s':>9}"]
    for name, m in report["models"].items():
        mc = m["mc_core_heldout"]
        lines.append(f"{name:<20}{m['valid_loss']:>7.3f}{m['unigram_loss']:>8.3f}"
                     f"{_acc(mc, 'all'):>7.3f}{_acc(mc, 'bucket/head'):>7.3f}"
                     f"{_acc(mc, 'bucket/tail'):>7.3f}"
                     f"{_acc(m['mc_specialist_heldout'], 'all'):>7.3f}{m['train_seconds']:>9.1f}")
    for name, m in report["models"].items():
        for k, v in m.get("niah", {}).items():
            lines.append(f"niah {name} {k}: score {v['score']:.3f} (n={v['n']}, "
                         f"{v['mean_length']} tokens)")
    lines.append(f"total {report['total_seconds']:.0f} s")
    return "\n".join(lines)
