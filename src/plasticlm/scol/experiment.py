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
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path

from plasticlm.config import deep_update
from plasticlm.data.squad import load_squad
from plasticlm.errors import PlasticError
from plasticlm.runs import read_metrics
from plasticlm.scol.baselines import batch_ttt, in_context_prefix, running_summaries
from plasticlm.scol.consolidate import num_layers_of
from plasticlm.scol.contexts import Context, contexts_from_passages, split_streams
from plasticlm.scol.ipo import pair_accuracy
from plasticlm.scol.matrix import AccuracyMatrix
from plasticlm.scol.meta import (
    action_stats,
    consolidate_stream,
    meta_train,
)
from plasticlm.scol.report import (
    PAPER,
    plot_squad,
    seeds_markdown,
    squad_markdown,
    summarise_seeds,
)
from plasticlm.scol.setup import (
    METHODS,
    ExperimentConfig,
    legal_sets,
    load_model,
    replay_pool,
    resolve_world_file,
    swap_names,
)


def _consolidating(selection: str, policy: str | None = None, layers=None) -> Callable:
    """A method that commits a LoRA update per context with a layer-selection rule, starting
    from a meta-trained ``policy`` (None: the untouched model); ``layers(base, policies)``
    gives a fixed rule's layers."""
    def run(name, mat, base, policies, tokenizer, stream, cfg, replay):
        start = policies.get(policy, base) if policy else base
        _, records, _ = consolidate_stream(
            copy.deepcopy(start), tokenizer, stream, copy.deepcopy(cfg.scol), selection,
            on_commit=lambda t, model: mat.add_row(model, tokenizer, t, full=_full_row(t, cfg)),
            desc=name,
            layers=layers(base, policies) if layers else None, replay=replay)
        return records
    return run


def _full_row(t: int, cfg: ExperimentConfig) -> bool:
    return (t + 1) % cfg.full_rows_every == 0


def _batch_ttt(name, mat, base, policies, tokenizer, stream, cfg, replay):
    trained = batch_ttt(base, tokenizer, stream, cfg.scol.lora, cfg.seed)
    # One training run on all contexts: only the last row exists; the diagonal of a single
    # row is its last entry, so immediate is reported from the same run.
    mat.add_row(trained, tokenizer, len(stream) - 1)
    mat.em = [mat.em[0][: i + 1] for i in range(len(stream) - 1)] + mat.em
    mat.f1 = [mat.f1[0][: i + 1] for i in range(len(stream) - 1)] + mat.f1
    if mat.swap_last:
        mat.swap_diag = list(mat.swap_last)


def _prompting(name, mat, base, policies, tokenizer, stream, cfg, replay):
    for t in range(len(stream)):
        mat.add_row(base, tokenizer, t, in_context_prefix(tokenizer, stream[: t + 1],
                                                          cfg.prompt_tokens),
                    full=_full_row(t, cfg))


def _summarisation(name, mat, base, policies, tokenizer, stream, cfg, replay):
    for t, note in enumerate(running_summaries(base, tokenizer, stream)):
        mat.add_row(base, tokenizer, t, note + "\n" if note else "", full=_full_row(t, cfg))


# Each method fills an accuracy matrix over the evaluation stream; those that commit
# updates return their step records. The names are setup.METHODS, labels report.LABELS.
RUNNERS: dict[str, Callable] = {
    "scol": _consolidating("greedy", "scol"),
    "untrained_policy": _consolidating("greedy"),
    "fixed_last": _consolidating("fixed", layers=lambda base, p: (num_layers_of(base) - 1,)),
    "fixed_best": _consolidating("fixed", layers=lambda base, p: (p.get("best_layer", 0),)),
    "scol_random": _consolidating("random", "scol"),
    "scol_lambda0": _consolidating("greedy", "scol_lambda0"),
    "sequential_ft": _consolidating("all"),
    "batch_ttt": _batch_ttt,
    "prompting": _prompting,
    "summarisation": _summarisation,
}


def _evaluate_method(name: str, base, policies: dict, tokenizer, stream: Sequence[Context],
                     cfg: ExperimentConfig, replay=None) -> tuple[AccuracyMatrix, list | None]:
    if name not in RUNNERS:
        raise PlasticError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    mat = AccuracyMatrix(stream)
    records = RUNNERS[name](name, mat, base, policies, tokenizer, stream, cfg, replay)
    return mat, records


def best_fixed_layer(base, tokenizer, train: Sequence[Sequence[Context]],
                     cfg: ExperimentConfig, replay=None) -> list[float]:
    """Per layer, the mean over the training streams of (immediate + retention) / 2 (F1)
    when every context commits that one layer: the fixed rule a policy must beat, chosen on
    the same streams the policy meta-trains on."""
    scores = []
    for layer in range(num_layers_of(base)):
        per_stream = []
        for s in train:
            mat = AccuracyMatrix(s)
            consolidate_stream(copy.deepcopy(base), tokenizer, s, copy.deepcopy(cfg.scol),
                               "fixed", on_commit=lambda t, m, mat=mat: mat.add_row(m, tokenizer, t),
                               layers=(layer,), desc=f"fixed layer {layer}", replay=replay)
            f1 = mat.summary()["f1"]
            per_stream.append(((f1["immediate"] or 0) + (f1["retention"] or 0)) / 2)
        scores.append(sum(per_stream) / max(1, len(per_stream)))
    return scores


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
    unknown = [m for m in cfg.methods if m not in METHODS]
    if unknown:
        raise PlasticError(f"unknown method(s) {', '.join(unknown)}; choose from "
                           f"{', '.join(METHODS)}")
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
    needs = {"scol": cfg.scol.lam, "scol_random": cfg.scol.lam, "scol_lambda0": 0.0}
    for name in ("scol", "scol_lambda0"):
        if not any(m in cfg.methods for m in needs if needs[m] == needs[name]):
            continue
        t = time.time()
        mcfg = replace(cfg.scol, lam=needs[name])
        if name == "scol_lambda0" and cfg.lambda0_outer_steps >= 0:
            mcfg = replace(mcfg, outer_steps=cfg.lambda0_outer_steps)
        policies[name] = meta_train(copy.deepcopy(base), tok, train, mcfg, out / f"meta_{name}",
                                    progress=progress, replay=replay)
        report["seconds"][f"meta_train_{name}"] = round(time.time() - t, 1)
        report[f"meta_{name}"] = read_metrics(out / f"meta_{name}" / "metrics.jsonl")

    if "scol" in policies and cfg.held_out_pairs:
        # Held-out preference pairs: best-of-K on the evaluation stream from the untouched
        # model (its rewards score candidates, nothing trains on them); does the meta-trained
        # policy rank them better than the untrained one?
        _, _, held = consolidate_stream(copy.deepcopy(base), tok, stream, copy.deepcopy(cfg.scol),
                                        "best", desc="held-out pairs", replay=replay)
        if held:
            report["held_out_pairs"] = {
                "n": len(held), "trained": pair_accuracy(policies["scol"], tok, held, cfg.scol.max_layers),
                "untrained": pair_accuracy(base, tok, held, cfg.scol.max_layers)}

    if "fixed_best" in cfg.methods:
        t = time.time()
        per_layer = best_fixed_layer(base, tok, train, cfg, replay)
        policies["best_layer"] = max(range(n_layers), key=per_layer.__getitem__)
        report["fixed_best"] = {"layer": policies["best_layer"], "train_score": per_layer}
        report["seconds"]["choose_fixed_best"] = round(time.time() - t, 1)

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
