"""K LoRA candidates trained together in one batch, each on its own layer set.

Each target linear layer gets K stacked LoRA pairs; the batch holds K copies of the
context, row block k seeing only candidate k's adapters (zero on layers it did not choose).
Candidates stay independent: the loss is the sum of per-candidate means and gradients are
clipped per candidate, so candidate k trains exactly as it would alone (same math as PEFT's
LoRA: ``W x + (alpha / r) B A x``, A Kaiming-uniform, B zero). On CPU one batched pass is
cheaper than K separate ones (see bench/scol_cost.py).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from torch import nn

from plasticlm.errors import PlasticError
from plasticlm.eval.lm_head import chunked_cross_entropy, hidden_states
from plasticlm.scol.consolidate import LoraTrainConfig, num_layers_of


class MultiLoRALinear(nn.Module):
    """A frozen linear layer plus K LoRA pairs; input rows are K equal blocks."""

    def __init__(self, base: nn.Linear, active: Sequence[bool], rank: int, alpha: float,
                 generators: Sequence[torch.Generator]):
        """``generators[i]`` draws candidate i's A, so its init does not depend on K."""
        super().__init__()
        self.base = base
        k, fan_in = len(active), base.in_features
        a = torch.empty(k, rank, fan_in)
        bound = 1.0 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)) on [rank, fan_in]
        for i, g in enumerate(generators):
            a[i].uniform_(-bound, bound, generator=g)
        # drawn on the CPU (the same init on any device), then kept where the layer is
        device = base.weight.device
        self.lora_a = nn.Parameter(a.to(device))
        self.lora_b = nn.Parameter(torch.zeros(k, base.out_features, rank, device=device))
        self.register_buffer("active", torch.tensor(active, dtype=torch.float32,
                                                    device=device)[:, None, None])
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.lora_a.shape[0]
        xk = x.reshape(k, -1, x.shape[-1])                           # [K, rows*T, in]
        delta = (xk @ self.lora_a.transpose(1, 2)) @ self.lora_b.transpose(1, 2)
        return self.base(x) + (self.scale * self.active * delta).reshape(
            *x.shape[:-1], -1)

    def merged_delta(self, i: int) -> torch.Tensor:
        """Candidate i's weight change [out, in] (zero where it is inactive)."""
        return self.scale * float(self.active[i]) * (self.lora_b[i] @ self.lora_a[i])


def _wrap(model, layer_sets: Sequence[set[int]], cfg: LoraTrainConfig, seeds: Sequence[int]
          ) -> dict[str, MultiLoRALinear]:
    wrapped: dict[str, MultiLoRALinear] = {}
    ordinal = -1
    for name, module in list(model.named_modules()):
        parts = name.split(".")
        if "layers" not in parts or parts[-1] not in cfg.target_modules:
            continue
        if not isinstance(module, nn.Linear):
            continue
        # Seeded per (candidate, module) so a candidate's init is the same in any batch.
        ordinal += 1
        gens = [torch.Generator().manual_seed(s * 1_000_003 + ordinal) for s in seeds]
        idx = int(parts[parts.index("layers") + 1])
        active = [idx in s for s in layer_sets]
        if not any(active):
            continue
        parent = model.get_submodule(".".join(parts[:-1]))
        multi = MultiLoRALinear(module, active, cfg.rank, cfg.alpha, gens)
        setattr(parent, parts[-1], multi)
        wrapped[name] = multi
    return wrapped


def adapt_lora_together(model, layer_sets: Sequence[Sequence[int]], windows: torch.Tensor,
                        cfg: LoraTrainConfig, seeds: Sequence[int] | None = None):
    """Train K candidates at once; returns ``(merged_models, losses)`` with one merged
    float32 copy of ``model`` per layer set and per-candidate loss curves [steps][K].

    ``windows`` = stack(ids [N, T], labels [N, T]); ``model`` is untouched.
    """
    sets = [{int(i) for i in s} for s in layer_sets]
    n = num_layers_of(model)
    if not sets or any(not s or min(s) < 0 or max(s) >= n for s in sets):
        raise PlasticError(f"every layer set must be a non-empty subset of 0..{n - 1}")
    k = len(sets)
    seeds = list(seeds) if seeds is not None else list(range(k))
    work = copy.deepcopy(model)
    for p in work.parameters():
        p.requires_grad_(False)
    wrapped = _wrap(work, sets, cfg, seeds)
    params = [p for m in wrapped.values() for p in (m.lora_a, m.lora_b)]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    ids, labels = windows[0], windows[1]
    device = next(model.parameters()).device
    batch_ids = ids.repeat(k, 1).to(device)
    batch_labels = labels.repeat(k, 1).to(device)
    work.train()
    curves = []
    for _ in range(cfg.steps):
        # the LM head only at labelled positions, in chunks: never [K*N, T, V] logits
        hidden = hidden_states(work, batch_ids)[:, :-1]             # [K*N, T-1, H]
        hidden = hidden.reshape(k, -1, hidden.shape[-1])            # [K, N*(T-1), H]
        targets = batch_labels[:, 1:].reshape(k, -1)                # [K, N*(T-1)]
        scored = targets != -100
        counts = scored.sum(-1).clamp(min=1)
        per_cand = torch.stack([chunked_cross_entropy(work, hidden[i][scored[i]],
                                                      targets[i][scored[i]])
                                for i in range(k)]) / counts        # [K]
        opt.zero_grad(set_to_none=True)
        per_cand.sum().backward()
        # Per-candidate clipping keeps each candidate's update what it would be alone.
        sq = torch.zeros(k, device=device)
        for p in params:
            sq += p.grad.detach().pow(2).flatten(1).sum(-1)
        factor = (cfg.grad_clip / (sq.sqrt() + 1e-6)).clamp(max=1.0)
        for p in params:
            p.grad.mul_(factor.view(-1, *([1] * (p.grad.dim() - 1))))
        opt.step()
        curves.append(per_cand.detach().tolist())
    merged_models = []
    with torch.no_grad():
        base_params = dict(model.named_parameters())
        for i in range(k):
            m = copy.deepcopy(model)
            mp = dict(m.named_parameters())
            for name, multi in wrapped.items():
                if multi.active[i].item():
                    w = mp[f"{name}.weight"]
                    w.copy_(base_params[f"{name}.weight"] + multi.merged_delta(i).to(w.dtype))
            m.eval()
            merged_models.append(m)
    return merged_models, curves
