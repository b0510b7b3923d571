"""``plasticlm scol experiment longbench``: LongBench-v2-format items consolidated chunk by
chunk and answered closed-book, in a short and a long regime."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from plasticlm.errors import PlasticError
from plasticlm.eval import CI, MCConfig, bootstrap_ci, evaluate_mc_items, format_ci
from plasticlm.experiments.scol.setup import ExperimentConfig, load_model, longbench_items
from plasticlm.scol.contexts import chunk_text, evidence_window
from plasticlm.scol.meta import meta_train
from plasticlm.scol.stream import consolidate_stream


def _mc_correct(model, tokenizer, item) -> bool:
    """Closed-book MC by log-prob of each `` <choice>`` after the QA prompt."""
    return evaluate_mc_items(model, tokenizer, [item],
                             MCConfig(method="continuation")).accuracy == 1.0


def run_longbench(cfg: ExperimentConfig, out: str | Path, progress: bool = True) -> dict:
    """LongBench-v2-format items chunked to ``chunk_tokens``: meta-train (intrinsic reward)
    on short-regime streams (at most one per outer step; the other short items are
    evaluated), then per item consolidate its chunks and answer closed-book (MC by log-prob).
    Regimes: short (``max_chunks``) and long (``long_max_chunks``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base, tok = load_model(cfg)
    items = longbench_items(cfg)
    short = [it for it in items if it.length == "short"]
    long = [it for it in items if it.length != "short"]
    if not short or not long:
        raise PlasticError("the LongBench file needs both short and medium/long items")
    scfg = replace(cfg.scol, reward="intrinsic")
    # Meta-training visits one stream per outer step, so it needs no more streams than steps;
    # every other short item is evaluated.
    n_train = max(1, min(len(short) // 2, cfg.scol.outer_steps))
    train_streams = [chunk_text(tok, it.context, cfg.chunk_tokens, f"{it.id}/")[: cfg.max_chunks]
                     for it in short[:n_train]]
    eval_short = short[n_train:] or short
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
        correct = {}
        for name, fn in methods.items():
            correct[name] = [float(_mc_correct(fn(s), tok, it)) for s, it in zip(streams, its)]
            res[name] = {"accuracy": sum(correct[name]) / len(its), "n": len(its),
                         "ci": asdict(bootstrap_ci(correct[name])), "correct": correct[name]}
        for name, control in (("scol", "base"), ("scol", "sequential_ft"),
                              ("sequential_ft", "base")):
            res[f"{name}_minus_{control}"] = asdict(bootstrap_ci(correct[name],
                                                                 baseline=correct[control]))
        res["evidence_located"] = located
        res["chunks_per_stream"] = sum(len(s) for s in streams) / len(streams)
        report["regimes"][regime] = res
    (out / "longbench.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "longbench.md").write_text(longbench_markdown(report))
    return report


def longbench_markdown(report: dict) -> str:
    """Accuracy per regime and method with 95% intervals over items, the paired differences
    to the untouched model and to sequential fine-tuning, and the paper's numbers."""
    paper = report["paper"]
    lines = ["MC accuracy in %, mean [95% CI over items]; differences paired on the same items. "
             "Chance 25%.", "",
             "| regime | n | chunks | untouched model (control) | sequential FT | SCoL | "
             "SCoL - untouched | SCoL - sequential FT | paper SCoL |",
             "|---|---|---|---|---|---|---|---|---|"]
    for regime, r in report["regimes"].items():
        lines.append(
            f"| {regime} | {r['scol']['n']} | {r['chunks_per_stream']:.1f} | "
            f"{format_ci(CI(**r['base']['ci']))} | {format_ci(CI(**r['sequential_ft']['ci']))} | "
            f"{format_ci(CI(**r['scol']['ci']))} | {format_ci(CI(**r['scol_minus_base']))} | "
            f"{format_ci(CI(**r['scol_minus_sequential_ft']))} | "
            f"{100 * paper[regime]:.1f} |")
    return "\n".join(lines) + "\n"
