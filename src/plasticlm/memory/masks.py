"""Masks of the memory layer's softmax branch: the sliding window and the padding.

The padding always comes from the 2D token mask ([B, T], True = real token) that the decoder's
pre-hook hands to each layer, never from the mask object the attention backend builds (a
4D tensor for eager/sdpa, a ``BlockMask`` for flex_attention, a 2D mask or None for
flash-attention), so the branch computes the same thing under every backend.
"""

from __future__ import annotations

import torch


def window_mask(q_len: int, k_len: int, window: int, device=None) -> torch.Tensor:
    """Boolean [q_len, k_len] band: query i (the last q_len of k_len positions) sees key j
    iff 0 <= (k_len - q_len + i) - j < window."""
    qi = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    kj = torch.arange(k_len, device=device)[None, :]
    return (qi - kj >= 0) & (qi - kj < window)


def window_attention_mask(seq_len: int, window: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive [1,1,T,T] mask (0 = attend, dtype min = masked) that makes any HF decoder
    attend within a window of ``window`` tokens: the windowed base model, for comparisons."""
    allowed = window_mask(seq_len, seq_len, window)
    mask = torch.zeros(seq_len, seq_len, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def padded_window_mask(t: int, window: int, token_mask: torch.Tensor | None,
                       device=None) -> torch.Tensor:
    """Boolean [B or 1, 1, T, T] (True = attend): the window band without padding keys.

    ``token_mask`` [B, T] (True = real token) or None (no padding). Every query keeps its own
    key, so a padding query's row is never empty (no NaN from the softmax); a real query's
    own key is real, so this changes nothing for real tokens.
    """
    band = window_mask(t, t, window, device)[None, None]                     # [1, 1, T, T]
    if token_mask is None:
        return band
    eye = torch.eye(t, dtype=torch.bool, device=device)
    keys = token_mask.to(device=device, dtype=torch.bool)[:, None, None, :]  # [B, 1, 1, T]
    return band & (keys | eye)
