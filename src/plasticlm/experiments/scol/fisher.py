"""Per-layer empirical Fisher of a context, how well selected layers recall its top, and
``plasticlm scol experiment fisher`` (the policy's selections against it).

F_l = mean over examples (the context's sentences, batch size 1) of the sum over layer l's
parameters of the squared gradient of the example's log-likelihood; with
``normalise`` (the default) divided by layer l's parameter count, so that layers of
different sizes compare per parameter.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from plasticlm.data.squad import load_squad
from plasticlm.errors import PlasticError
from plasticlm.eval import encode_with_bos
from plasticlm.experiments.scol.plots import plot_fisher
from plasticlm.experiments.scol.report import PAPER
from plasticlm.experiments.scol.setup import ExperimentConfig, load_model, resolve_world_file
from plasticlm.models import load_causal_lm
from plasticlm.scol.consolidate import float32_master, num_layers_of
from plasticlm.scol.contexts import contexts_from_passages, split_streams
from plasticlm.scol.stream import action_stats, consolidate_stream

_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE.split(text.strip()) if s]


def layer_fisher(model, tokenizer, text: str, max_examples: int = 16,
                 normalise: bool = True) -> list[float]:
    """Empirical Fisher per Transformer layer [L] of ``text``'s sentences (the first
    ``max_examples``), per parameter when ``normalise``; the model's weights are not
    changed."""
    examples = [encode_with_bos(tokenizer, s) for s in sentences(text)[:max_examples]]
    examples = [e for e in examples if len(e) >= 2]
    if not examples:
        raise PlasticError("the context has no sentence of two or more tokens to score")
    n_layers = int(model.config.num_hidden_layers)
    device = next(model.parameters()).device
    per_layer: dict[int, list[torch.nn.Parameter]] = {i: [] for i in range(n_layers)}
    for name, p in model.named_parameters():
        parts = name.split(".")
        if "layers" in parts:
            per_layer[int(parts[parts.index("layers") + 1])].append(p)
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(True)
    totals = [0.0] * n_layers
    was_training = model.training
    model.eval()
    try:
        for ids in examples:
            x = torch.tensor([ids], device=device)
            logits = model(input_ids=x).logits[0, :-1].float()
            loglik = logits.log_softmax(-1).gather(-1, x[0, 1:, None]).sum()
            model.zero_grad(set_to_none=True)
            loglik.backward()
            for i, params in per_layer.items():
                totals[i] += sum(float(p.grad.double().pow(2).sum()) for p in params
                                 if p.grad is not None)
    finally:
        model.zero_grad(set_to_none=True)
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)
        model.train(was_training)
    sizes = [sum(p.numel() for p in per_layer[i]) if normalise else 1 for i in range(n_layers)]
    return [t / len(examples) / size for t, size in zip(totals, sizes)]


def top_layers(fisher: Sequence[float], k: int) -> set[int]:
    """The ``k`` layers with the largest Fisher (ties broken by lower index)."""
    order = sorted(range(len(fisher)), key=lambda i: (-fisher[i], i))
    return set(order[:k])


def recall(selected: Sequence[int], top: set[int]) -> float:
    """|selected ∩ top| / |top|."""
    if not top:
        raise PlasticError("the top-Fisher set is empty")
    return len(set(selected) & top) / len(top)


def random_recall(size: int, top: set[int], num_layers: int, samples: int = 200,
                  seed: int = 0) -> tuple[float, float]:
    """Recall of random selections of ``size`` layers: (exact expectation size/L, sampled
    mean over ``samples`` draws)."""
    rng = random.Random(seed)
    sampled = sum(recall(rng.sample(range(num_layers), size), top) for _ in range(samples))
    return size / num_layers, sampled / samples


def run_fisher(cfg: ExperimentConfig, out: str | Path, policy_path: str | None = None,
               progress: bool = True) -> dict:
    """Recall of the policy's greedy selections among each context's top-Fisher layers vs
    random selections of the same size (one stream, drifting by greedy commits)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base, tok = load_model(cfg)
    policy = (float32_master(load_causal_lm(policy_path, dtype="float32")[0]) if policy_path
              else base)
    contexts = contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")))
    _, stream = split_streams(contexts, 0, 0, cfg.eval_length, cfg.seed)
    n_layers = num_layers_of(policy)
    rows = []

    fisher_by_t: dict[int, list[float]] = {}

    def before_commit_fisher(t: int, model) -> None:
        if t + 1 < len(stream):
            fisher_by_t[t + 1] = layer_fisher(model, tok, stream[t + 1].text)

    fisher_by_t[0] = layer_fisher(policy, tok, stream[0].text)
    _, records, _ = consolidate_stream(copy.deepcopy(policy), tok, stream, cfg.scol, "greedy",
                                       on_commit=before_commit_fisher, desc="fisher")
    for r in records:
        f = fisher_by_t[r.index]
        top = top_layers(f, cfg.fisher_top or len(r.layers))
        exp_rand, samp_rand = random_recall(len(r.layers), top, n_layers, seed=cfg.seed + r.index)
        rows.append({"context": r.context_id, "fisher": f, "top": sorted(top),
                     "selected": list(r.layers), "recall": recall(r.layers, top),
                     "random_expected": exp_rand, "random_sampled": samp_rand})
    report = {"config": asdict(cfg), "paper": PAPER["fisher_recall"], "rows": rows,
              "recall_selected": sum(x["recall"] for x in rows) / len(rows),
              "recall_random": sum(x["random_expected"] for x in rows) / len(rows),
              "layer_histogram": action_stats(records, n_layers)["layer_histogram"],
              "mean_fisher": [sum(x["fisher"][i] for x in rows) / len(rows)
                              for i in range(n_layers)]}
    (out / "fisher.json").write_text(json.dumps(report, indent=1) + "\n")
    plot_fisher(report, out)
    return report
