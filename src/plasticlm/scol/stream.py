"""SCoL's inner loop: write every context of a stream into the weights, one commit per
context, the layers chosen by a selection rule (:mod:`plasticlm.scol.selections`).

Per context: the running model (the policy, drifted by earlier commits) proposes layer sets;
each distinct one is adapted with LoRA on a copy; a scored rule rewards every candidate,
commits the best and turns candidate pairs with different rewards into IPO preference pairs.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from plasticlm.eval import encode_with_bos
from plasticlm.scol.candidates import adapt_lora_together
from plasticlm.scol.config import SCoLConfig
from plasticlm.scol.consolidate import (
    adapt_lora,
    context_windows,
    float32_master,
    num_layers_of,
    pad_of,
    with_replay,
)
from plasticlm.scol.ipo import PreferencePair, preference_pairs
from plasticlm.scol.policy import LayerGrammar, action_prompt
from plasticlm.scol.records import Context, Reward
from plasticlm.scol.rewards import reward_probe
from plasticlm.scol.selections import SELECTIONS, Turn


@dataclass
class StepRecord:
    """What happened at one context of a stream."""

    index: int
    context_id: str
    layers: tuple[int, ...]
    reward: Reward | None
    candidates: list[dict]
    seconds: float


def consolidate_stream(model, tokenizer, contexts: Sequence[Context], cfg: SCoLConfig,
                       selection: str = "best",
                       on_commit: Callable[[int, object], None] | None = None,
                       progress: bool = False, desc: str = "consolidate",
                       layers: Sequence[int] | None = None, replay: torch.Tensor | None = None
                       ) -> tuple[object, list[StepRecord], list[PreferencePair]]:
    """Write every context of a stream into the weights, one commit per context.

    ``selection`` names a rule of ``SELECTIONS``: ``best`` (K sampled candidates, the best by
    reward committed, preference pairs collected), ``greedy`` (the policy's greedy action, no
    reward needed), ``random`` (random layers, as many as the greedy action names), ``all``
    (every layer: sequential fine-tuning) or ``fixed`` (``layers`` at every context). With
    ``cfg.lora.replay`` > 0, each update also trains on that many windows of ``replay``
    (generic text, [2, N, T]). Returns ``(running_model, records, pairs)``;
    ``on_commit(t, model)`` runs after each commit (for evaluation).
    """
    rule = SELECTIONS[selection]
    model = float32_master(model)
    n_layers = num_layers_of(model)
    cfg.check(n_layers)
    rule.check(layers, n_layers)
    grammar = LayerGrammar.for_model(model, tokenizer, n_layers, cfg.max_layers)
    gen = torch.Generator().manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    records: list[StepRecord] = []
    pairs: list[PreferencePair] = []
    for t in tqdm(range(len(contexts)), desc=desc, disable=not progress, leave=False):
        t0 = time.time()
        ctx = contexts[t]
        prompt = action_prompt(ctx.text, n_layers, cfg.prompt_chars)
        seed = cfg.seed * 100_003 + t
        windows = with_replay(context_windows(tokenizer, ctx.text, cfg.lora.max_tokens), replay,
                              cfg.lora.replay, pad_of(tokenizer), seed)
        actions, completions = rule.candidates(Turn(model, tokenizer, prompt, grammar, cfg,
                                                    gen, rng, n_layers, layers))
        # Identical selections would train identical adapters: adapt each distinct one once.
        distinct: dict[tuple[int, ...], list[int]] = {}
        for a, c in zip(actions, completions):
            distinct.setdefault(a, c)
        candidates = []
        if rule.scored:
            probe = reward_probe(model, tokenizer, contexts, t, cfg)
            if cfg.together and len(distinct) > 1:
                merged, curves = adapt_lora_together(model, list(distinct), windows, cfg.lora,
                                                     [seed + i for i in range(len(distinct))])
                trained = [(m, [c[i] for c in curves]) for i, m in enumerate(merged)]
            else:
                trained = [adapt_lora(model, chosen, windows, cfg.lora, seed)
                           for chosen in distinct]
            rewards: list[Reward] = []
            for (chosen, comp), (adapted, losses) in zip(distinct.items(), trained):
                rewards.append(probe(adapted))
                candidates.append({"layers": list(chosen), "reward": asdict(rewards[-1]),
                                   "loss_first": losses[0], "loss_last": losses[-1],
                                   "completion": comp})
            i = rule.choose([r.total for r in rewards])
            model, reward, chosen = trained[i][0], rewards[i], list(distinct)[i]
            del trained
            prompt_ids = encode_with_bos(tokenizer, prompt)
            pairs += preference_pairs(prompt_ids, [c["completion"] for c in candidates],
                                      [c["reward"]["total"] for c in candidates])
        else:
            chosen = next(iter(distinct))
            model, losses = adapt_lora(model, chosen, windows, cfg.lora, seed)
            reward = None
            candidates.append({"layers": list(chosen), "loss_first": losses[0],
                               "loss_last": losses[-1]})
        for c in candidates:
            c.pop("completion", None)
        records.append(StepRecord(t, ctx.id, tuple(chosen), reward, candidates,
                                  round(time.time() - t0, 3)))
        if on_commit is not None:
            on_commit(t, model)
    return model, records, pairs


def action_stats(records: Sequence[StepRecord], num_layers: int) -> dict:
    """Histogram of committed layers and how varied the candidates were."""
    hist = Counter(i for r in records for i in r.layers)
    distinct = [len({tuple(c["layers"]) for c in r.candidates}) for r in records]
    return {"layer_histogram": [hist.get(i, 0) for i in range(num_layers)],
            "mean_layers_per_action": sum(len(r.layers) for r in records) / max(1, len(records)),
            "mean_distinct_candidates": sum(distinct) / max(1, len(distinct))}
