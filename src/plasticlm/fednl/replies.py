"""Server-side aggregation of theta: validation of replies and the weighted mean."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

log = logging.getLogger("plasticlm.fednl")


def reply_problem(theta: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> str | None:
    """Why a client's theta cannot be aggregated (wrong keys, shapes, non-finite), or None."""
    missing, extra = sorted(set(reference) - set(theta)), sorted(set(theta) - set(reference))
    if missing or extra:
        return f"wrong keys (missing {missing[:3]}, unexpected {extra[:3]})"
    for name, ref in reference.items():
        if tuple(theta[name].shape) != tuple(ref.shape):
            return f"{name} has shape {tuple(theta[name].shape)}, expected {tuple(ref.shape)}"
        if not torch.isfinite(theta[name]).all():
            return f"{name} holds NaN or infinity"
    return None


def weighted_mean(thetas: Sequence[dict[str, torch.Tensor]],
                  weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """sum_i w_i theta_i / sum_i w_i, key by key (float32)."""
    if not thetas:
        raise ValueError("nothing to aggregate")
    total = float(sum(weights))
    return {name: sum(t[name].float() * (w / total) for t, w in zip(thetas, weights))
            for name in thetas[0]}
