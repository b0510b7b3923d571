"""theta, the parameters a federated method trains and sends: read, copy and write them."""

from __future__ import annotations

import re

import torch
from torch import nn

from plasticlm.errors import PlasticError


def trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    """theta as live parameters, by name (tied weights appear once)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def get_theta(model: nn.Module) -> dict[str, torch.Tensor]:
    """A float32 CPU copy of theta, ready to send."""
    return {n: p.detach().float().cpu().clone() for n, p in trainable(model).items()}


def set_theta(model: nn.Module, theta: dict[str, torch.Tensor]) -> None:
    """Copy ``theta`` into the model's trainable parameters (keys and shapes must match)."""
    params = trainable(model)
    missing, extra = sorted(set(params) - set(theta)), sorted(set(theta) - set(params))
    if missing or extra:
        raise PlasticError(f"theta does not fit the model: missing {missing[:3]}, "
                           f"unexpected {extra[:3]}")
    with torch.no_grad():
        for n, p in params.items():
            if tuple(theta[n].shape) != tuple(p.shape):
                raise PlasticError(f"theta {n}: shape {tuple(theta[n].shape)} != {tuple(p.shape)}")
            p.copy_(theta[n].to(p.dtype))


_LAYER = re.compile(r"layers\.(\d+)\.")


def layer_of(name: str) -> int | None:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None
