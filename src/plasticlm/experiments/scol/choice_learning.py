"""Preference pairs from the oracle's exhaustive candidates, and IPO on them.

Pairs come from exhaustive candidates instead of K samples: on each context the oracle's walk
(:func:`plasticlm.experiments.scol.oracle.run_stream`) adapts every layer set of 1..``oracle_layers``
layers once and scores each by the ``loglik`` reward; every two candidates whose rewards
differ make a pair, so C candidates give up to C(C-1)/2 pairs per context for one walk. The
policy (the base model, fully trainable) is trained by IPO against itself untouched, in
minibatches of ``policy_batch_contexts`` contexts, one batched forward [C, T] per context
(:func:`plasticlm.scol.action_scores.candidate_logprobs`). Held-out pair accuracy and the
greedy choices are measured every ``policy_eval_every`` steps (the learning curve). The
experiment around it is :mod:`plasticlm.experiments.scol.policy_experiment`.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from plasticlm.eval import encode_with_bos
from plasticlm.experiments.scol.oracle import TIE
from plasticlm.experiments.scol.setup import ExperimentConfig
from plasticlm.scol.action_scores import candidate_logprobs
from plasticlm.scol.ipo import ipo_loss
from plasticlm.scol.policy import SEPARATOR, LayerGrammar, action_prompt, sample_actions


def action_ids(grammar: LayerGrammar, layers) -> list[int]:
    """Completion ids [n] that name ``layers`` under ``grammar`` (longest token first at each
    character), ending with the end token."""
    text = SEPARATOR.join(str(i) for i in sorted(layers))
    by_text = {}
    for tid, s in sorted(grammar.token_text.items()):
        by_text.setdefault(s, tid)
    ids, i, state = [], 0, grammar.start()
    while i < len(text):
        for n in range(len(text) - i, 0, -1):
            tid = by_text.get(text[i:i + n])
            if tid is not None and grammar.step_text(state, text[i:i + n]) is not None:
                ids.append(tid)
                state = grammar.step_text(state, text[i:i + n])
                i += n
                break
        else:
            raise ValueError(f"no token path names layers {text!r} under the grammar")
    return ids + [grammar.end_id]


@dataclass
class ContextChoices:
    """One context's prompt, the candidates' completions and their rewards per LoRA seed."""

    prompt: str
    prompt_ids: list[int]
    sets: list[tuple[int, ...]]
    completions: list[list[int]]
    rewards: dict[str, list[float]]      # LoRA seed name -> loglik total per candidate
    policy: tuple[int, ...]              # the untrained policy's greedy action

    def pairs(self, name: str) -> list[tuple[int, int]]:
        """(better, worse) candidate indices whose ``name`` rewards differ."""
        r = self.rewards[name]
        return [(i, j) if r[i] > r[j] else (j, i)
                for i, j in itertools.combinations(range(len(r)), 2) if abs(r[i] - r[j]) > TIE]


def choices_of(records: list[dict], stream, tok, grammar, n_layers: int, prompt_chars: int
               ) -> list[ContextChoices]:
    """The walk's records as :class:`ContextChoices` (single candidates only: the policy's
    own action is one of them)."""
    out = []
    for rec, ctx in zip(records, stream):
        sets = [tuple(c) for c in rec["candidates"][: rec["n_sets"]]]
        prompt = action_prompt(ctx.text, n_layers, prompt_chars)
        out.append(ContextChoices(
            prompt, encode_with_bos(tok, prompt), sets,
            [action_ids(grammar, s) for s in sets],
            {k: [x["loglik"]["total"] for x in v[: rec["n_sets"]]]
             for k, v in rec["rewards"].items()},
            tuple(rec["policy"])))
    return out


@torch.no_grad()
def pair_accuracy(policy, data: list[ContextChoices], grammar, name: str) -> float:
    """Share of ``name``'s pairs whose better candidate the policy rates higher."""
    hits = total = 0
    for c in data:
        lp = candidate_logprobs(policy, c.prompt_ids, c.completions, grammar)
        for w, ell in c.pairs(name):
            hits += float(lp[w]) > float(lp[ell])
            total += 1
    return hits / max(1, total)


@torch.no_grad()
def greedy_choices(policy, tok, data: list[ContextChoices], grammar) -> list[tuple[int, ...]]:
    """The policy's greedy action (constrained decoding) per context."""
    return [sample_actions(policy, tok, c.prompt, grammar, 1, 0.0)[0].layers for c in data]


def train_ipo(policy, reference, tok, train: list[ContextChoices], held: list[ContextChoices],
              grammar, cfg: ExperimentConfig, seed: int, progress: bool = True) -> list[dict]:
    """``cfg.policy_steps`` IPO steps on ``policy`` (in place) over the training pairs;
    returns the learning curve (held-out and training pair accuracy, IPO loss, the learned
    greedy actions on the held-out contexts)."""
    with torch.no_grad():
        ref = [candidate_logprobs(reference, c.prompt_ids, c.completions, grammar)
               for c in train]
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.scol.ipo_lr, weight_decay=0.0)
    rng = random.Random(seed)
    order: list[int] = []
    curve = []

    def measure(step: int, loss: float | None) -> None:
        policy.eval()
        curve.append({"step": step, "ipo_loss": loss,
                      "held_out_pair_accuracy": pair_accuracy(policy, held, grammar, "B"),
                      "train_pair_accuracy": pair_accuracy(policy, train, grammar, "A"),
                      "held_out_choices": [list(s) for s in greedy_choices(policy, tok, held,
                                                                           grammar)]})

    measure(0, None)
    for step in tqdm(range(1, cfg.policy_steps + 1), desc=f"IPO, seed {seed}",
                     disable=not progress, leave=False):
        policy.train()
        batch = []
        while len(batch) < min(cfg.policy_batch_contexts, len(train)):
            if not order:
                order = rng.sample(range(len(train)), len(train))
            batch.append(order.pop())
        opt.zero_grad(set_to_none=True)
        n_pairs = sum(len(train[i].pairs("A")) for i in batch)
        total = 0.0
        for i in batch:
            pairs = train[i].pairs("A")
            if not pairs:
                continue
            lp = candidate_logprobs(policy, train[i].prompt_ids, train[i].completions, grammar)
            w, ell = (torch.tensor(x) for x in zip(*pairs))
            loss = ipo_loss(lp[w], lp[ell], ref[i][w], ref[i][ell], cfg.scol.ipo_tau)
            (loss * len(pairs) / n_pairs).backward()
            total += loss.item() * len(pairs) / n_pairs
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        if step % cfg.policy_eval_every == 0 or step == cfg.policy_steps:
            measure(step, total)
    return curve
