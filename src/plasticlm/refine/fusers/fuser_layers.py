"""The per-receiver-layer fuser modules, one registered class per fuser kind (``FUSER_KINDS``,
the only place the kinds are listed): C2C's (separate K and V paths reading both caches,
Gumbel-sigmoid gates per layer) and a low-rank one kept for the size comparison.

A kind is a module built from the fuser's shape (``from_config``: anything with the fields of
:class:`FuserShape`, such as the fuser's ``FuserConfig``) with
``forward(t_keys, t_values, r_keys=None, r_values=None) -> (keys, values)`` and
``gates_on() -> (key gate on, value gate on)``; add one with ``@FUSER_KINDS.register(name)``.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from plasticlm.registry import Registry

FUSER_KINDS: Registry[type[nn.Module]] = Registry("fuser kind")


class FuserShape(Protocol):
    """What a kind reads of its fuser's config (``FuserConfig`` has these fields): the two
    caches' KV heads per layer and head dims, and the kinds' widths."""

    receiver_kv_heads: int
    receiver_head_dim: int
    transmitter_kv_heads: int
    transmitter_head_dim: int
    rank: int        # lowrank: bottleneck width
    hidden: int      # c2c: hidden width of the K and V paths
    dropout: float   # c2c: dropout in the residual blocks


class ResidualBlock(nn.Module):
    """x + dropout(W2 gelu(W1 rmsnorm(x)))."""

    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.norm = nn.RMSNorm(width)
        self.up = nn.Linear(width, width)
        self.down = nn.Linear(width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.down(nn.functional.gelu(self.up(self.norm(x)))))


class C2CPath(nn.Module):
    """One of C2C's two paths (K or V): concat(transmitter, receiver) per token -> hidden ->
    2 residual blocks -> receiver width, plus a sigmoid weight per head from the hidden."""

    def __init__(self, t_width: int, r_width: int, heads: int, hidden: int, dropout: float):
        super().__init__()
        # the two caches live at different scales: each is RMS-normalised before the concat
        self.t_norm, self.r_norm = nn.RMSNorm(t_width), nn.RMSNorm(r_width)
        self.inp = nn.Linear(t_width + r_width, hidden)
        self.blocks = nn.Sequential(ResidualBlock(hidden, dropout), ResidualBlock(hidden, dropout))
        self.out_norm = nn.RMSNorm(hidden)
        self.out = nn.Linear(hidden, r_width)
        self.head_weight = nn.Linear(hidden, heads)
        # zero output map: an untrained fuser leaves the receiver's cache as it was
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, t: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """t [B,T,t_width], r [B,T,r_width] -> (projection [B,T,r_width], weight [B,T,H])."""
        h = self.blocks(self.inp(torch.cat([self.t_norm(t), self.r_norm(r)], dim=-1)))
        h = self.out_norm(h)
        return self.out(h), torch.sigmoid(self.head_weight(h))


@FUSER_KINDS.register("c2c")
class C2CLayerFuser(nn.Module):
    """C2C's fuser for one receiver layer: K and V paths, each with its own layer gate."""

    @classmethod
    def from_config(cls, c: FuserShape) -> C2CLayerFuser:
        return cls(c.transmitter_kv_heads, c.transmitter_head_dim, c.receiver_kv_heads,
                   c.receiver_head_dim, c.hidden, c.dropout)

    def gates_on(self) -> tuple[bool, bool]:
        """The K and V gates at inference (hard: on when the logit is positive)."""
        return bool(self.gate_logits[0] > 0), bool(self.gate_logits[1] > 0)

    def __init__(self, t_heads: int, t_dim: int, heads: int, head_dim: int, hidden: int,
                 dropout: float):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        t_width, r_width = t_heads * t_dim, heads * head_dim
        self.key_path = C2CPath(t_width, r_width, heads, hidden, dropout)
        self.value_path = C2CPath(t_width, r_width, heads, hidden, dropout)
        # logits of the K and V layer gates; 0 = a fair coin at the start of training
        self.gate_logits = nn.Parameter(torch.zeros(2))
        self.temperature = 1.0  # set by the trainer's schedule; unused at inference

    def gates(self) -> torch.Tensor:
        """[2] (K, V) gate values: Gumbel-sigmoid samples while training, hard 0/1 otherwise."""
        if not self.training:
            return (self.gate_logits > 0).to(self.gate_logits.dtype)
        u = torch.rand_like(self.gate_logits).clamp(1e-6, 1 - 1e-6)
        noise = torch.log(u) - torch.log1p(-u)
        return torch.sigmoid((self.gate_logits + noise) / self.temperature)

    def forward(self, t_keys: torch.Tensor, t_values: torch.Tensor,
                r_keys: torch.Tensor | None = None, r_values: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Transmitter K/V [B, Ht, T, Dt] (un-rotated), receiver K/V [B, Hr, T, Dr] or None
        (prefix fusion: zeros) -> gated, weighted K and V [B, Hr, T, Dr] (K un-rotated)."""
        b, _, t, _ = t_keys.shape

        def tokens(z):  # [B, H, T, D] -> [B, T, H*D]
            return z.permute(0, 2, 1, 3).reshape(b, t, -1).float()

        def heads(z):
            return z.view(b, t, self.heads, self.head_dim).transpose(1, 2)

        width = self.heads * self.head_dim
        rk = tokens(r_keys) if r_keys is not None else t_keys.new_zeros(b, t, width).float()
        rv = tokens(r_values) if r_values is not None else t_keys.new_zeros(b, t, width).float()
        gate_k, gate_v = self.gates()
        k, wk = self.key_path(tokens(t_keys), rk)
        v, wv = self.value_path(tokens(t_values), rv)
        k = heads(k) * (gate_k * wk).transpose(1, 2)[..., None]
        v = heads(v) * (gate_v * wv).transpose(1, 2)[..., None]
        return k, v


@FUSER_KINDS.register("lowrank")
class LowRankLayerFuser(nn.Module):
    """concat(K_t, V_t) per token -> rank-r code -> receiver K, V, per-head weight; one gate."""

    @classmethod
    def from_config(cls, c: FuserShape) -> LowRankLayerFuser:
        return cls(2 * c.transmitter_kv_heads * c.transmitter_head_dim, c.receiver_kv_heads,
                   c.receiver_head_dim, c.rank)

    def gates_on(self) -> tuple[bool, bool]:
        """Soft gates: every layer reads its transmitter layer."""
        return True, True

    def __init__(self, in_width: int, heads: int, head_dim: int, rank: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        width = heads * head_dim
        self.norm = nn.RMSNorm(in_width)
        self.down = nn.Linear(in_width, rank, bias=False)
        self.up = nn.Linear(rank, 2 * width, bias=False)
        self.receiver_norm = nn.RMSNorm(2 * width)
        self.head_weight = nn.Linear(rank + 2 * width, heads)
        self.gate = nn.Parameter(torch.zeros(()))
        # Zero output map: an untrained fuser leaves the receiver's cache as it was.
        nn.init.zeros_(self.up.weight)

    def forward(self, t_keys: torch.Tensor, t_values: torch.Tensor,
                r_keys: torch.Tensor | None = None, r_values: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Transmitter K/V [B, Ht, T, Dt] (un-rotated), receiver K/V [B, Hr, T, Dr] or None
        -> weighted, gated K and V [B, Hr, T, Dr] (K un-rotated)."""
        b, _, t, _ = t_keys.shape
        x = torch.cat([t_keys, t_values], dim=1).permute(0, 2, 1, 3).reshape(b, t, -1)
        code = nn.functional.gelu(self.down(self.norm(x.float())))
        k, v = self.up(code).chunk(2, dim=-1)
        if r_keys is None:
            own = code.new_zeros(b, t, 2 * self.heads * self.head_dim)
        else:
            own = torch.cat([r_keys, r_values], dim=1).permute(0, 2, 1, 3).reshape(b, t, -1)
            own = self.receiver_norm(own.float())
        w = torch.sigmoid(self.head_weight(torch.cat([code, own], dim=-1)))      # [B, T, Hr]
        scale = (torch.sigmoid(self.gate) * w).transpose(1, 2)[..., None]        # [B, Hr, T, 1]

        def heads(z):
            return z.view(b, t, self.heads, self.head_dim).transpose(1, 2)

        return heads(k) * scale, heads(v) * scale
