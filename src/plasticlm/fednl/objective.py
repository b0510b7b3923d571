"""The local objective every method shares (cross-entropy on the answer tokens), the hook a
method adds to it, and the optimiser's parameter groups."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from plasticlm.eval.lm_head import chunked_cross_entropy, hidden_states
from plasticlm.memory import MemoryStream


def answer_loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy on the labelled (answer) positions of ``ids`` [B, T] (their
    mean, float32).

    Batches are right-padded, so a causal model needs no attention mask: padding comes
    after every labelled position and cannot change its logits. Only the labelled positions'
    hidden states go through the LM head, a chunk at a time
    (:func:`~plasticlm.eval.lm_head.chunked_cross_entropy`).
    """
    device = next(model.parameters()).device
    ids = ids.to(device)
    targets = labels[:, 1:].to(device)
    scored = targets != -100
    hidden = hidden_states(model, ids)[:, :-1]
    return chunked_cross_entropy(model, hidden[scored], targets[scored]) / scored.sum()


def segmented_answer_backward(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor,
                              segment_tokens: int) -> float:
    """Truncated BPTT: ``ids`` [B, T] read in segments of ``segment_tokens`` through a
    :class:`~plasticlm.memory.MemoryStream`, the state (window cache and memory) carried from
    segment to segment and detached at each boundary; each segment's share of the answer
    cross-entropy is back-propagated as it is read, so activations are held for one segment
    only. Accumulates into ``.grad`` the gradient :func:`answer_loss` would give, less the
    paths that cross a boundary; returns the loss (a float, same normalisation).
    """
    device = next(model.parameters()).device
    ids, labels = ids.to(device), labels.to(device)
    targets = labels[:, 1:]
    count = int((targets != -100).sum())
    if count == 0:
        raise ValueError("a batch without labelled tokens")
    stream = MemoryStream(model, chunk_tokens=segment_tokens)
    total = 0.0
    for start in range(0, ids.shape[1] - 1, segment_tokens):
        stop = min(start + segment_tokens, ids.shape[1] - 1)
        # logits at positions start..stop-1 predict the tokens start+1..stop
        seg = targets[:, start:stop]
        scored = bool((seg != -100).any())
        # a segment with nothing to score only carries the state: no graph to keep
        logits = stream.feed(ids[:, start:stop], grad=scored)
        if scored:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), seg.flatten(),
                                   ignore_index=-100, reduction="sum") / count
            loss.backward()
            total += loss.item()
        stream.detach()
    return total


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
