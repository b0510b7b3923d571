"""IPO (Azar et al. 2023): preference pairs from candidates' rewards and the IPO loss.

h = (logp(y_w) - logp(y_l)) - (logp_ref(y_w) - logp_ref(y_l)),  loss = mean((h - 1/(2 tau))^2),
with sequence log-probs of the completions (over their free tokens under the action grammar:
:func:`plasticlm.scol.policy.completion_logprob`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


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
