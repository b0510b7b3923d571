"""The optional flash-linear-attention kernel (``fla.ops.delta_rule.chunk_delta_rule``).

fla's Triton kernels run on CUDA only and take bf16/fp16 inputs in the [B,T,H,D] layout;
this module imports fla lazily, once, and adapts the layout of :mod:`plasticlm.memory.ops`
([B,H,T,D]). See https://github.com/fla-org/flash-linear-attention.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch

HALF_DTYPES = (torch.bfloat16, torch.float16)


@functools.cache
def fla_chunk_delta_rule() -> Callable | None:
    """fla's ``chunk_delta_rule``, or None when fla (or its Triton) cannot be imported."""
    try:
        from fla.ops.delta_rule import chunk_delta_rule
    except Exception:  # ImportError, or a Triton/driver error raised while importing
        return None
    params = inspect.signature(chunk_delta_rule).parameters
    if "head_first" in params:  # old releases default to [B,H,T,D]; ask for [B,T,H,D]
        return functools.partial(chunk_delta_rule, head_first=False)
    return chunk_delta_rule


def delta_rule_fla(q, k, v, beta, initial_state=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Ungated delta rule through fla: q, k [B,H,T,Dk], v [B,H,T,Dv] (bf16/fp16, CUDA),
    beta [B,H,T], initial_state [B,H,Dk,Dv] or None -> o [B,H,T,Dv] in v's dtype and the
    final state [B,H,Dk,Dv] in float32. No scaling of q (scale=1), as in the torch ops."""
    kernel = fla_chunk_delta_rule()
    if kernel is None:
        raise RuntimeError("flash-linear-attention (fla) is not importable")
    dtype = q.dtype
    q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v.to(dtype)))
    beta = beta.to(dtype).transpose(1, 2).contiguous()
    state = initial_state.float().contiguous() if initial_state is not None else None
    o, final = kernel(q, k, v, beta, scale=1.0, initial_state=state, output_final_state=True)
    return o.transpose(1, 2).to(dtype), final.float()
