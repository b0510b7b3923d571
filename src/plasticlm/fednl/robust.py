"""Aggregation that a hostile client cannot take over: weights from what the server knows,
update norms clipped relative to the other clients', and robust rules by name.

A client's update is ``theta_i - theta_global``. With ``clip > 0`` an update whose norm
exceeds ``clip`` times the median update norm of the round is scaled down to that bound
(norm clipping relative to the current theta). Rules, applied to the clipped updates:

- ``mean``: the example-weighted mean (FedAvg); a client's count is clipped to
  ``max_examples`` (the most the server handed any client), never taken as claimed;
- ``median``: the coordinate-wise median (Yin et al. 2018, arXiv:1803.01498);
- ``trimmed_mean``: the coordinate-wise mean after cutting the ``trim`` share of largest and
  smallest values (same paper);
- ``krum``: the update with the smallest sum of squared distances to its ``n - f - 2``
  nearest others, ``f = (n - 3) // 2`` assumed hostile (Blanchard et al. 2017,
  arXiv:1703.02507).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from plasticlm.errors import PlasticError

log = logging.getLogger("plasticlm.fednl")
RULES = ("mean", "median", "trimmed_mean", "krum")


@dataclass(frozen=True)
class AggregationConfig:
    """How the server combines the clients' theta."""

    rule: str = "mean"        # mean | median | trimmed_mean | krum
    clip: float = 10.0        # update norm bound, x the round's median update norm (0: off)
    trim: float = 0.2         # trimmed_mean: share cut at each end
    max_examples: int = 0     # a client's weight is its count clipped to this (0: max_train)

    def __post_init__(self):
        if self.rule not in RULES:
            raise PlasticError(f"unknown aggregation rule {self.rule!r}; choose one of "
                               f"{', '.join(RULES)}")
        if self.clip < 0 or not 0 <= self.trim < 0.5 or self.max_examples < 0:
            raise PlasticError("aggregation: clip >= 0, 0 <= trim < 0.5, max_examples >= 0")


def _flat(theta: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([theta[n].float().flatten() for n in names])


def _unflat(vector: torch.Tensor, like: dict[str, torch.Tensor], names: list[str]
            ) -> dict[str, torch.Tensor]:
    out, i = {}, 0
    for n in names:
        k = like[n].numel()
        out[n] = vector[i:i + k].view_as(like[n]).float().clone()
        i += k
    return out


def clip_updates(updates: torch.Tensor, factor: float) -> tuple[torch.Tensor, list[int]]:
    """Rows of ``updates`` [N, P] scaled down to ``factor`` x their median norm; returns the
    clipped updates and the rows that were clipped."""
    norms = updates.norm(dim=1)
    if factor <= 0 or len(norms) == 0:
        return updates, []
    bound = factor * float(norms.median())
    if bound <= 0:
        return updates, []
    scale = (bound / norms.clamp(min=1e-12)).clamp(max=1.0)
    clipped = [i for i, s in enumerate(scale.tolist()) if s < 1.0]
    return updates * scale[:, None], clipped


def krum_index(updates: torch.Tensor) -> int:
    """Krum's choice among the rows of ``updates`` [N, P]."""
    n = updates.shape[0]
    f = max(0, (n - 3) // 2)
    k = max(1, n - f - 2)
    dist = torch.cdist(updates, updates) ** 2
    scores = [float(dist[i][torch.arange(n) != i].sort().values[:k].sum()) for i in range(n)]
    return min(range(n), key=scores.__getitem__)


def robust_aggregate(thetas: Sequence[dict[str, torch.Tensor]], claimed: Sequence[float],
                     current: dict[str, torch.Tensor], cfg: AggregationConfig,
                     max_examples: int) -> tuple[dict[str, torch.Tensor], dict]:
    """The new global theta from the clients' ``thetas`` (validated: same keys and shapes as
    ``current``) and their ``claimed`` example counts; returns it and what was done (weights
    used, clipped clients)."""
    if not thetas:
        raise ValueError("nothing to aggregate")
    names = sorted(current)
    base = _flat(current, names)
    updates = torch.stack([_flat(t, names) - base for t in thetas])
    updates, clipped = clip_updates(updates, cfg.clip)
    cap = cfg.max_examples or max_examples
    weights = [min(max(float(c), 0.0), float(cap)) if math.isfinite(float(c)) else 0.0
               for c in claimed]
    if cfg.rule == "mean":
        if sum(weights) <= 0:
            raise ValueError("every client's example count is zero")
        w = torch.tensor(weights) / sum(weights)
        step = (updates * w[:, None]).sum(0)
    elif cfg.rule == "median":
        step = updates.median(dim=0).values if len(updates) % 2 else \
            updates.sort(dim=0).values[len(updates) // 2 - 1: len(updates) // 2 + 1].mean(0)
    elif cfg.rule == "trimmed_mean":
        cut = int(cfg.trim * len(updates))
        ordered = updates.sort(dim=0).values
        step = ordered[cut: len(updates) - cut].mean(0)
    else:
        step = updates[krum_index(updates)]
    if clipped:
        log.warning("clipped the updates of %d client(s) to %.1fx the median norm",
                    len(clipped), cfg.clip)
    return _unflat(base + step, current, names), {"weights": weights, "clipped": clipped,
                                                   "rule": cfg.rule}
