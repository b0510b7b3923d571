"""Per-layer empirical Fisher of a context and how well selected layers recall its top.

F_l = mean over examples (the context's sentences, batch size 1) of the sum over layer l's
parameters of the squared gradient of the example's log-likelihood (anchors.md); with
``normalise`` (the default) divided by layer l's parameter count, so that layers of
different sizes compare per parameter.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

import torch

from plasticlm.errors import PlasticError
from plasticlm.eval import encode_with_bos

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
