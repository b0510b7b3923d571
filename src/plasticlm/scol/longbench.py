"""``plasticlm scol experiment longbench``: LongBench-v2-format items consolidated chunk by
chunk and answered closed-book, in a short and a long regime."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from plasticlm.data.longbench import load_longbench
from plasticlm.errors import PlasticError
from plasticlm.eval import MCConfig, evaluate_mc_items
from plasticlm.scol.contexts import chunk_text, evidence_window
from plasticlm.scol.meta import consolidate_stream, meta_train
from plasticlm.scol.setup import ExperimentConfig, load_model, resolve_world_file


def _mc_correct(model, tokenizer, item) -> bool:
    """Closed-book MC by log-prob of each `` <choice>`` after the QA prompt."""
    return evaluate_mc_items(model, tokenizer, [item],
                             MCConfig(method="continuation")).accuracy == 1.0


def run_longbench(cfg: ExperimentConfig, out: str | Path, progress: bool = True) -> dict:
    """LongBench-v2-format items chunked to ``chunk_tokens``: meta-train (intrinsic reward)
    on short-regime streams, then per item consolidate its chunks and answer closed-book
    (MC by log-prob). Regimes: short (``max_chunks``) and long (``long_max_chunks``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base, tok = load_model(cfg)
    items = load_longbench(resolve_world_file(cfg, "longbench"))
    short = [it for it in items if it.length == "short"]
    long = [it for it in items if it.length != "short"]
    if not short or not long:
        raise PlasticError("the LongBench file needs both short and medium/long items")
    scfg = replace(cfg.scol, reward="intrinsic")
    train_streams = [chunk_text(tok, it.context, cfg.chunk_tokens, f"{it.id}/")[: cfg.max_chunks]
                     for it in short[: max(1, len(short) // 2)]]
    eval_short = short[max(1, len(short) // 2):] or short
    policy = meta_train(copy.deepcopy(base), tok, train_streams, scfg, out / "meta",
                        progress=progress)
    report: dict = {"config": asdict(cfg), "paper": {"short": 0.423, "long": 0.370,
                                                     "sequential_ft_long": 0.230},
                    "regimes": {}}
    methods: dict[str, Callable] = {
        "scol": lambda s: consolidate_stream(copy.deepcopy(policy), tok, s, scfg, "greedy")[0],
        "sequential_ft": lambda s: consolidate_stream(copy.deepcopy(base), tok, s, scfg,
                                                      "all")[0],
        "base": lambda s: base,
    }
    for regime, its, cap in (("short", eval_short, cfg.max_chunks),
                             ("long", long, cfg.long_max_chunks)):
        res: dict = {}
        streams, located = [], 0
        for it in its:
            # The regime's number of chunks, always including the evidence (when it can be
            # located): a stream without it tests guessing, not consolidation.
            chunks = chunk_text(tok, it.context, cfg.chunk_tokens, f"{it.id}/")
            window, found = evidence_window(chunks, it.question,
                                            it.choices["ABCD".index(it.answer)], cap)
            streams.append(window)
            located += found
        for name, fn in methods.items():
            correct = [_mc_correct(fn(s), tok, it) for s, it in zip(streams, its)]
            res[name] = {"accuracy": sum(correct) / len(correct), "n": len(correct)}
        res["evidence_located"] = located
        res["chunks_per_stream"] = sum(len(s) for s in streams) / len(streams)
        report["regimes"][regime] = res
    (out / "longbench.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
