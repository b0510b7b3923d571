"""Aggregation that a hostile client cannot take over: weights from what the server knows,
update norms clipped relative to the other clients', and robust rules by name.

A client's update is ``theta_i - theta_global``. With ``clip > 0`` an update whose norm
exceeds ``clip`` times the median update norm of the round is scaled down to that bound
(norm clipping relative to the current theta). Each rule of ``AGGREGATORS`` maps the clipped
updates to the round's step; a new rule is one decorated function here:

- ``mean``: the example-weighted mean (FedAvg); a client's count is clipped to the most the
  server handed any client (``data.max_train``), never taken as claimed;
- ``median``: the coordinate-wise median (Yin et al. 2018, arXiv:1803.01498), as Flower's
  ``FedMedian``;
- ``trimmed_mean``: the coordinate-wise mean after cutting the ``trim`` share of largest and
  smallest values (same paper), Flower's ``trim_mean`` (``FedTrimmedAvg``);
- ``krum``: the update with the smallest sum of squared distances to its ``n - f - 2``
  nearest others, ``f = (n - 3) // 2`` assumed hostile (Blanchard et al. 2017,
  arXiv:1703.02507), Flower's ``select_multikrum`` (``Krum``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from flwr.serverapp.strategy.multikrum import select_multikrum

from plasticlm.fednl.config_sections import AggregationConfig
from plasticlm.fednl.registries import AGGREGATORS

log = logging.getLogger("plasticlm.fednl")


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


def clip_updates(updates: torch.Tensor, factor: float, floor: float = 0.0
                 ) -> tuple[torch.Tensor, list[int]]:
    """Rows of ``updates`` [N, P] scaled down to ``factor`` x their median norm, or to
    ``floor`` when that is larger (a zero-norm majority would otherwise switch clipping off);
    returns the clipped updates and the rows that were clipped. ``factor`` 0: no clipping."""
    norms = updates.norm(dim=1)
    if factor <= 0 or len(norms) == 0:
        return updates, []
    # the lower middle of an even count (torch's median): with two clients, a huge update
    # does not set the bound; a zero lower middle falls back to the floor
    bound = max(factor * float(norms.median()), floor)
    if bound <= 0:
        return updates, []
    scale = (bound / norms.clamp(min=1e-12)).clamp(max=1.0)
    clipped = [i for i, s in enumerate(scale.tolist()) if s < 1.0]
    return updates * scale[:, None], clipped


@AGGREGATORS.register("mean")
def mean_step(updates: torch.Tensor, weights: list[float], cfg: AggregationConfig
              ) -> torch.Tensor:
    """The weights' mean of ``updates`` [N, P] (FedAvg)."""
    if sum(weights) <= 0:
        raise ValueError("every client's example count is zero")
    w = torch.tensor(weights) / sum(weights)
    return (updates * w[:, None]).sum(0)


@AGGREGATORS.register("median")
def median_step(updates, weights, cfg):
    """The coordinate-wise median (two middles averaged, as numpy's and FedMedian's)."""
    n = len(updates)
    return updates.median(dim=0).values if n % 2 else \
        updates.sort(dim=0).values[n // 2 - 1: n // 2 + 1].mean(0)


@AGGREGATORS.register("trimmed_mean")
def trimmed_mean_step(updates, weights, cfg):
    """Flower's ``trim_mean`` (FedTrimmedAvg) over the clients' updates."""
    return torch.from_numpy(np.asarray(trim_mean(updates.double().numpy(), cfg.trim))).float()


def krum_index(updates: torch.Tensor) -> int:
    """Krum's choice among the rows of ``updates`` [N, P], by Flower's ``select_multikrum``
    with ``f = (n - 3) // 2`` hostile clients assumed."""
    n = updates.shape[0]
    # one ArrayRecord per row (a list of ndarrays: ArrayRecord takes no dict of them)
    contents = [RecordDict({"arrays": ArrayRecord([row.double().numpy().copy()])})
                for row in updates]
    (chosen,) = select_multikrum(contents, num_malicious_nodes=max(0, (n - 3) // 2),
                                 num_nodes_to_select=1)
    return next(i for i, c in enumerate(contents) if c is chosen)


@AGGREGATORS.register("krum")
def krum_step(updates, weights, cfg):
    return updates[krum_index(updates)]


def robust_aggregate(thetas: Sequence[dict[str, torch.Tensor]], claimed: Sequence[float],
                     current: dict[str, torch.Tensor], cfg: AggregationConfig,
                     max_examples: int,
                     server_step: Callable[[torch.Tensor], torch.Tensor] | None = None
                     ) -> tuple[dict[str, torch.Tensor], dict]:
    """The new global theta from the clients' ``thetas`` (validated: same keys and shapes as
    ``current``) and their ``claimed`` example counts; returns it and what was done (weights
    used, clipped clients). ``server_step`` (a server optimiser, :mod:`.server_opt`) maps the
    rule's step [P] to theta's, before the step bound."""
    if not thetas:
        raise ValueError("nothing to aggregate")
    names = sorted(current)
    base = _flat(current, names)
    updates = torch.stack([_flat(t, names) - base for t in thetas])
    norms = updates.norm(dim=1)
    updates, clipped = clip_updates(updates, cfg.clip, cfg.clip_floor)
    cap = max_examples
    weights = [min(max(float(c), 0.0), float(cap)) if math.isfinite(float(c)) else 0.0
               for c in claimed]
    step = AGGREGATORS[cfg.rule](updates, weights, cfg)
    if server_step is not None:
        step = server_step(step)
    if clipped:
        log.warning("clipped the updates of %d client(s) to %.1fx the median norm",
                    len(clipped), cfg.clip)
    info = {"weights": weights, "clipped": clipped, "rule": cfg.rule,
            "update_norms": [round(float(x), 6) for x in norms],
            "step_norm": float(step.norm())}
    problem = step_problem(step, cfg.max_step)
    if problem:
        # the round is refused: the previous theta stays (the caller logs and records it)
        info["refused"] = problem
        return {n: current[n].float().clone() for n in names}, info
    return _unflat(base + step, current, names), info


def step_problem(step: torch.Tensor, max_step: float) -> str | None:
    """Why the aggregate ``step`` [P] must not be committed (not finite, or its root-mean-square
    over ``max_step``: a bound that means the same for a gate and for a whole model), or None."""
    if not bool(torch.isfinite(step).all()):
        return f"the aggregate has {int((~torch.isfinite(step)).sum())} non-finite values"
    rms = float(step.double().pow(2).mean().sqrt()) if step.numel() else 0.0
    if not math.isfinite(rms) or rms > max_step:
        return (f"the aggregate moves theta by {rms:.4g} (root-mean-square), over "
                f"aggregation.max_step={max_step:g}")
    return None
