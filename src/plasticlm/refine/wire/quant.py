"""How KV caches travel: one registered class per cache quantisation (``QUANTS``, the only
place they are listed). float32 and bf16 are casts; int8 and fp8 (e4m3) divide keys by a
scale per channel and values by a scale per token (KIVI: keys vary by channel, RoPE pairs
and outlier dims, values by token), each scale stored in bf16 and rounded up so no entry
overflows. Add one with ``@QUANTS.register(name)`` on a :class:`Quant` subclass."""

from __future__ import annotations

import torch

from plasticlm.registry import Registry

SCALE_DTYPE = torch.bfloat16         # scales: 2 bytes each, with float32's range


class Quant:
    """How a cache's K or V [L, H, T, D] travels: its stored dtype, and (scaled kinds) its
    scale, per channel [L, H, 1, D] (keys) or per token [L, H, T, 1] (values)."""

    stored: torch.dtype
    scaled = False

    @classmethod
    def encode(cls, x: torch.Tensor, per: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        return x.to(cls.stored).contiguous(), None


class ScaledQuant(Quant):
    """Entries divided by a scale that maps each channel's (token's) largest to ``top``."""

    scaled = True
    top: float

    @classmethod
    def cast(cls, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def encode(cls, x: torch.Tensor, per: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        dim = 2 if per == "channel" else 3
        amax = x.abs().amax(dim=dim, keepdim=True).float()
        scale = torch.where(amax > 0, amax / cls.top, torch.ones_like(amax))
        # Quantise with the scale the receiver will see, rounded up so no entry overflows.
        scale = (scale * (1 + 2**-7)).to(SCALE_DTYPE)
        return cls.cast(x.float() / scale.float()).contiguous(), scale.contiguous()


QUANTS: Registry[type[Quant]] = Registry("cache quantisation")


@QUANTS.register("float32")
class Float32(Quant):
    stored = torch.float32


@QUANTS.register("bf16")
class BFloat16(Quant):
    stored = torch.bfloat16


@QUANTS.register("int8")
class Int8(ScaledQuant):
    stored, top = torch.int8, 127.0

    @classmethod
    def cast(cls, q: torch.Tensor) -> torch.Tensor:
        return q.round().clamp(-127, 127).to(torch.int8)


@QUANTS.register("fp8")
class Float8(ScaledQuant):
    """e4m3: 3 mantissa bits, largest finite 448."""

    stored, top = torch.float8_e4m3fn, 448.0

    @classmethod
    def cast(cls, q: torch.Tensor) -> torch.Tensor:
        return q.to(cls.stored)


def dequantise(q: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    x = q.float()
    return x if scale is None else x * scale.float()
