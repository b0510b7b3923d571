"""The delta rule by its definition: one token at a time, Python loops over batch and heads,
float64. The reference the fast forms (:mod:`plasticlm.memory.ops`) are tested and
benchmarked against, kept beside them as flash-linear-attention keeps ``naive.py``.
"""

from __future__ import annotations

import torch


def delta_rule_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor | None = None, g: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """o [B,H,T,Dv] and the final state [B,H,Dk,Dv], in float64, of q, k [B,H,T,Dk],
    v [B,H,T,Dv], beta [B,H,T], optional initial ``state`` and log-decay ``g`` [B,H,T]:
    ``S *= exp(g_t)``; ``u = beta_t (v_t - S^T k_t)``; ``S += k_t u^T``; ``o_t = S^T q_t``."""
    q, k, v, beta = (x.double() for x in (q, k, v, beta))
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    s = torch.zeros(b, h, dk, dv, dtype=torch.float64) if state is None else state.double()
    outs, states = [], []
    for bi in range(b):
        for hi in range(h):
            S = s[bi, hi]
            for ti in range(t):
                if g is not None:
                    S = S * torch.exp(g[bi, hi, ti].double())
                u = beta[bi, hi, ti] * (v[bi, hi, ti] - S.T @ k[bi, hi, ti])
                S = S + torch.outer(k[bi, hi, ti], u)
                outs.append(S.T @ q[bi, hi, ti])
            states.append(S)
    if t:
        out = torch.stack(outs).reshape(b, h, t, dv)
    else:
        out = torch.zeros(b, h, 0, dv, dtype=torch.float64)
    return out, torch.stack(states).reshape(b, h, dk, dv)
