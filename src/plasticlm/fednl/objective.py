"""The local objective every method shares (cross-entropy on the answer tokens), the hook a
method adds to it, and the optimiser's parameter groups."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def answer_loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy on the labelled (answer) positions of ``ids`` [B, T].

    Batches are right-padded, so a causal model needs no attention mask: padding comes
    after every labelled position and cannot change its logits.
    """
    device = next(model.parameters()).device
    logits = model(input_ids=ids.to(device)).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                           labels[:, 1:].flatten().to(device), ignore_index=-100)


def is_gate_parameter(name: str) -> bool:
    """The memory's mixing gate logits, beta and decay biases: scalars per head that Adam,
    moving each parameter by about ``lr`` per step, would barely move at the LoRA rate."""
    return name.endswith(("gate_logit", "beta_proj.bias", "decay_proj.bias"))


def param_groups(params: dict[str, nn.Parameter], gate_lr: float) -> list[dict]:
    """AdamW groups: the gate parameters at ``gate_lr``, the rest at the optimiser's lr."""
    gates = [p for n, p in params.items() if is_gate_parameter(n)]
    rest = [p for n, p in params.items() if not is_gate_parameter(n)]
    return [{"params": rest}] + ([{"params": gates, "lr": gate_lr}] if gates else [])


class LocalObjective:
    """One round's additions to the plain local objective (none by default)."""

    def penalty(self, params: dict[str, nn.Parameter]) -> torch.Tensor | None:
        return None

    def before_step(self, params: dict[str, nn.Parameter]) -> None:
        pass

    def after_step(self, params: dict[str, nn.Parameter]) -> None:
        pass

    def finish(self, theta: dict, start: dict, state: dict) -> None:
        pass
