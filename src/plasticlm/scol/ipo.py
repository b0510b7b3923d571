"""IPO (Azar et al. 2023, arXiv:2310.12036): preference pairs from candidates' rewards, the IPO
loss, one IPO update of the policy, and how well a policy ranks held-out pairs.

h = (logp(y_w) - logp(y_l)) - (logp_ref(y_w) - logp_ref(y_l)),  loss = mean((h - 1/(2 tau))^2),
with sequence log-probs of the completions (over their free tokens under the action grammar:
:func:`plasticlm.scol.action_scores.completion_logprob`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from plasticlm.errors import PlasticError
from plasticlm.scol.action_scores import completion_logprob, constrained_entropy
from plasticlm.scol.consolidate import num_layers_of
from plasticlm.scol.policy import LayerGrammar


@dataclass(frozen=True)
class PreferencePair:
    """One prompt with a preferred (``chosen``) and a dispreferred (``rejected``) completion."""

    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]
    margin: float               # reward(chosen) - reward(rejected) > 0


def ipo_loss(logp_chosen: torch.Tensor, logp_rejected: torch.Tensor,
             ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, tau: float = 0.1
             ) -> torch.Tensor:
    """Mean IPO loss over pairs; each input [P] holds completion log-probs."""
    h = (logp_chosen - logp_rejected) - (ref_chosen - ref_rejected)
    return ((h - 1.0 / (2.0 * tau)) ** 2).mean()


def preference_pairs(prompt_ids: Sequence[int], completions: Sequence[Sequence[int]],
                     rewards: Sequence[float], min_margin: float = 1e-6) -> list[PreferencePair]:
    """Every ordered pair of candidates whose rewards differ by more than ``min_margin``,
    the better one as ``chosen``; identical completions never pair."""
    out = []
    for i in range(len(completions)):
        for j in range(len(completions)):
            if (rewards[i] - rewards[j] > min_margin
                    and tuple(completions[i]) != tuple(completions[j])):
                out.append(PreferencePair(tuple(prompt_ids), tuple(completions[i]),
                                          tuple(completions[j]), rewards[i] - rewards[j]))
    return out


def pairs_to_json(pairs: Sequence[PreferencePair]) -> list[dict]:
    return [{"prompt_ids": list(p.prompt_ids), "chosen_ids": list(p.chosen_ids),
             "rejected_ids": list(p.rejected_ids), "margin": p.margin} for p in pairs]


def pairs_from_json(rows: Sequence[dict]) -> list[PreferencePair]:
    return [PreferencePair(tuple(r["prompt_ids"]), tuple(r["chosen_ids"]),
                           tuple(r["rejected_ids"]), float(r["margin"])) for r in rows]


def ipo_update(policy, reference, pairs: Sequence[PreferencePair], opt: torch.optim.Optimizer,
               tau: float, epochs: int = 1, grammar: LayerGrammar | None = None,
               reference_logps: dict | None = None, diversity: float = 0.0) -> dict:
    """``epochs`` IPO steps on ``policy`` over all ``pairs`` (one step per epoch,
    gradients accumulated pair by pair); returns the loss and mean h before and after.
    With ``grammar`` the log-probs are over the free tokens under the grammar-masked
    distribution (:func:`plasticlm.scol.action_scores.completion_logprob`). ``reference_logps``
    (pair -> reference log-probs) is read and filled, so a fixed reference scores each
    buffered pair once across outer steps."""
    if not pairs:
        return {"pairs": 0}
    cache = {} if reference_logps is None else reference_logps
    with torch.no_grad():
        for p in pairs:
            if p not in cache:
                cache[p] = (completion_logprob(reference, list(p.prompt_ids),
                                               list(p.chosen_ids), grammar),
                            completion_logprob(reference, list(p.prompt_ids),
                                               list(p.rejected_ids), grammar))
    ref_w = torch.stack([cache[p][0] for p in pairs])
    ref_l = torch.stack([cache[p][1] for p in pairs])

    def h_values() -> torch.Tensor:
        with torch.no_grad():
            w = torch.stack([completion_logprob(policy, list(p.prompt_ids), list(p.chosen_ids),
                                                grammar) for p in pairs])
            ell = torch.stack([completion_logprob(policy, list(p.prompt_ids),
                                                  list(p.rejected_ids), grammar) for p in pairs])
        return (w - ell) - (ref_w - ref_l)

    target = 1.0 / (2.0 * tau)
    h_before = h_values()
    policy.train()
    for _ in range(epochs):
        opt.zero_grad(set_to_none=True)
        for i, p in enumerate(pairs):
            lw = completion_logprob(policy, list(p.prompt_ids), list(p.chosen_ids), grammar)
            ll = completion_logprob(policy, list(p.prompt_ids), list(p.rejected_ids), grammar)
            loss = ipo_loss(lw[None], ll[None], ref_w[i:i + 1], ref_l[i:i + 1], tau)
            if diversity > 0 and grammar is not None:
                ent = (constrained_entropy(policy, list(p.prompt_ids), list(p.chosen_ids),
                                           grammar)
                       + constrained_entropy(policy, list(p.prompt_ids), list(p.rejected_ids),
                                             grammar)) / 2
                loss = loss - diversity * ent
            (loss / len(pairs)).backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
    policy.eval()
    h_after = h_values()
    return {"pairs": len(pairs),
            "ipo_loss_before": float(((h_before - target) ** 2).mean()),
            "ipo_loss_after": float(((h_after - target) ** 2).mean()),
            "h_before": float(h_before.mean()), "h_after": float(h_after.mean())}


@torch.no_grad()
def pair_accuracy(policy, tokenizer, pairs: Sequence[PreferencePair], max_layers: int) -> float:
    """Share of preference ``pairs`` whose chosen completion the policy rates above the
    rejected one (grammar-masked log-probs of the free tokens); on pairs from streams the
    policy never meta-trained on, this is how well it learned to pick."""
    if not pairs:
        raise PlasticError("no preference pairs to score")
    grammar = LayerGrammar.for_model(policy, tokenizer, num_layers_of(policy), max_layers)
    hits = 0
    for p in pairs:
        chosen = completion_logprob(policy, list(p.prompt_ids), list(p.chosen_ids), grammar)
        rejected = completion_logprob(policy, list(p.prompt_ids), list(p.rejected_ids), grammar)
        hits += float(chosen) > float(rejected)
    return hits / len(pairs)
