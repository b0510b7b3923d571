"""theta's building blocks: a low-rank update and a short causal convolution."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class LoRA(nn.Module):
    """Low-rank update x -> (x A^T) B^T * scale; B starts at zero so the update starts at zero."""

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float):
        super().__init__()
        self.A = nn.Parameter(torch.empty(rank, in_features))
        self.B = nn.Parameter(torch.empty(out_features, rank))
        self.scale = alpha / rank
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        nn.init.zeros_(self.B)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out], computed in the parameters' dtype."""
        return (F.linear(F.linear(x.to(self.A.dtype), self.A), self.B) * self.scale).to(x.dtype)


class ShortConv(nn.Module):
    """Depthwise causal convolution over time, initialised to the identity (last tap = 1)."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        self.weight = nn.Parameter(torch.empty(channels, kernel))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.zero_()
            self.weight[:, -1] = 1.0

    def forward(self, x: torch.Tensor, past: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B,T,C], past [B,K-1,C] (zeros if None) -> (y [B,T,C], new past [B,K-1,C])."""
        b, t, c = x.shape
        if past is None:
            past = x.new_zeros(b, self.kernel - 1, c)
        full = torch.cat([past.to(x.dtype), x], dim=1)                       # [B, K-1+T, C]
        y = F.conv1d(full.transpose(1, 2), self.weight.to(x.dtype)[:, None, :], groups=c)
        return y.transpose(1, 2), full[:, full.shape[1] - (self.kernel - 1):]  # len >= K-1 always
