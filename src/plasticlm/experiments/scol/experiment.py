"""``plasticlm scol experiment squad``: SCoL against its baselines and controls.

squad: meta-train on disjoint training streams, then consolidate one evaluation stream with
each method and fill the lower-triangular accuracy matrix (row r = closed-book accuracy on
contexts 0..r after r+1 commits, as SEAL reports it). immediate = mean of the diagonal;
retention = mean of the last row over every context but the last. Accuracy is SQuAD exact
match of greedy answers (F1 beside it).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from plasticlm.config import deep_update
from plasticlm.data.squad import load_squad
from plasticlm.experiments.scol.plots import plot_squad
from plasticlm.experiments.scol.report import (
    PAPER,
    seeds_markdown,
    squad_markdown,
    summarise_seeds,
)
from plasticlm.experiments.scol.setup import (
    ExperimentConfig,
    legal_sets,
    load_model,
    replay_pool,
    resolve_world_file,
    swap_names,
)
from plasticlm.runs import read_metrics
from plasticlm.scol.baselines import SCOL_METHODS
from plasticlm.scol.consolidate import num_layers_of
from plasticlm.scol.contexts import contexts_from_passages, split_streams
from plasticlm.scol.ipo import pair_accuracy
from plasticlm.scol.matrix import AccuracyMatrix
from plasticlm.scol.meta import meta_train
from plasticlm.scol.records import Context
from plasticlm.scol.stream import action_stats, consolidate_stream


def _evaluate_method(name: str, base, policies: dict, tokenizer, stream: Sequence[Context],
                     cfg: ExperimentConfig, replay=None) -> tuple[AccuracyMatrix, list | None]:
    mat = AccuracyMatrix(stream)
    records = SCOL_METHODS[name].run(name, mat, base, policies, tokenizer, stream, cfg, replay)
    return mat, records


def _policies_needed(cfg: ExperimentConfig) -> list[str]:
    """The meta-trained policies the chosen methods start from (each named after the method
    that owns it), in the registry's order."""
    return [p for p in SCOL_METHODS.names() if any(SCOL_METHODS[m].policy == p for m in cfg.methods)]


def same_config(stored: dict | None, cfg: ExperimentConfig) -> bool:
    """Whether a seed's stored config is ``cfg``. Compared as JSON (a stored config has lists
    where the dataclass has tuples); a setting added since the seed ran counts as its
    default, which by rule reproduces the behaviour from before it existed."""
    if not isinstance(stored, dict):
        return False
    as_json = json.loads(json.dumps(asdict(cfg)))
    defaults = json.loads(json.dumps(asdict(ExperimentConfig())))
    return deep_update(defaults, stored) == as_json


def run_squad(cfg: ExperimentConfig, out: str | Path, progress: bool = True) -> dict:
    """The SQuAD experiment over ``cfg.seeds`` seeds: each seed's run in ``out/seed-S``
    (reused when its report exists for the same config), then ``report.json`` and
    ``report.md`` in ``out`` with means and 95% intervals over seeds and contexts."""
    out = Path(out)
    per_seed = []
    for i in range(cfg.seeds):
        scfg = replace(cfg, seed=cfg.seed + i, seeds=1,
                       scol=replace(cfg.scol, seed=cfg.scol.seed + i))
        folder = out / f"seed-{scfg.seed}"
        done = folder / "report.json"
        if done.exists() and same_config(json.loads(done.read_text()).get("config"), scfg):
            per_seed.append(json.loads(done.read_text()))
        else:
            per_seed.append(run_squad_seed(scfg, folder, progress))
    held = [r["held_out_pairs"] for r in per_seed if "held_out_pairs" in r]
    report = {"config": asdict(cfg), "paper": PAPER, "seeds": [r["config"]["seed"]
                                                              for r in per_seed],
              "summary": summarise_seeds(per_seed),
              "held_out_pairs": {
                  "n": sum(h["n"] for h in held),
                  "trained": sum(h["trained"] * h["n"] for h in held) / max(1, sum(h["n"]
                                                                             for h in held)),
                  "untrained": sum(h["untrained"] * h["n"] for h in held) / max(
                      1, sum(h["n"] for h in held))} if held else None,
              "oracle_layer": [r.get("fixed_best", {}).get("layer") for r in per_seed],
              "seconds": sum(r["seconds"]["total"] for r in per_seed)}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "report.md").write_text(seeds_markdown(report))
    return report


def run_squad_seed(cfg: ExperimentConfig, out: str | Path, progress: bool = True) -> dict:
    """One seed of the SQuAD experiment; writes ``report.json``, ``report.md`` and plots
    under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    base, tok = load_model(cfg)
    contexts = contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")),
                                      legal_sets(cfg), swap_names(cfg))
    train, stream = split_streams(contexts, cfg.train_streams, cfg.stream_length,
                                  cfg.eval_length, cfg.seed)
    n_layers = num_layers_of(base)
    replay = replay_pool(cfg, tok)
    report: dict = {"config": asdict(cfg), "paper": PAPER, "num_layers": n_layers,
                    "eval_contexts": [c.id for c in stream], "methods": {}, "seconds": {}}
    base_mat = AccuracyMatrix(stream)
    base_mat.add_row(base, tok, len(stream) - 1)
    report["base_closed_book"] = base_mat.summary()["em"]["final_all"]
    report["base_matrix_em"] = base_mat.em
    report["base_legal"] = base_mat.legal[-1]
    report["base_mc_last"] = base_mat.mc_last
    report["base_swap_last"] = base_mat.swap_last

    policies: dict = {}
    for name in _policies_needed(cfg):
        t = time.time()
        policies[name] = meta_train(copy.deepcopy(base), tok, train,
                                    SCOL_METHODS[name].meta_config(cfg), out / f"meta_{name}",
                                    progress=progress, replay=replay)
        report["seconds"][f"meta_train_{name}"] = round(time.time() - t, 1)
        report[f"meta_{name}"] = read_metrics(out / f"meta_{name}" / "metrics.jsonl")

    if "scol" in policies and cfg.held_out_pairs:
        # Held-out preference pairs: best-of-K on the evaluation stream from the untouched
        # model (its rewards score candidates, nothing trains on them); does the meta-trained
        # policy rank them better than the untrained one?
        _, _, held = consolidate_stream(copy.deepcopy(base), tok, stream, cfg.scol, "best",
                                        desc="held-out pairs", replay=replay)
        if held:
            report["held_out_pairs"] = {
                "n": len(held), "trained": pair_accuracy(policies["scol"], tok, held, cfg.scol.max_layers),
                "untrained": pair_accuracy(base, tok, held, cfg.scol.max_layers)}

    for name in dict.fromkeys(cfg.methods):   # work on the training streams (fixed_best's)
        if SCOL_METHODS[name].prepare is not None:
            t = time.time()
            SCOL_METHODS[name].prepare(base, tok, train, cfg, replay, policies, report)
            report["seconds"][f"choose_{name}"] = round(time.time() - t, 1)

    for name in cfg.methods:
        t = time.time()
        mat, records = _evaluate_method(name, base, policies, tok, stream, cfg, replay)
        entry = mat.summary()
        if records is not None:
            entry["layers"] = [list(r.layers) for r in records]
            entry["seconds_per_context"] = sum(r.seconds for r in records) / len(records)
            entry.update(action_stats(records, n_layers))
        report["methods"][name] = entry
        report["seconds"][name] = round(time.time() - t, 1)
    report["seconds"]["total"] = round(time.time() - t_start, 1)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "report.md").write_text(squad_markdown(report))
    plot_squad(report, out)
    return report
