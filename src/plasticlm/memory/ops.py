"""The delta rule (optionally gated), token by token and chunkwise (WY/UT transform).

Layout (flash-linear-attention's): q, k [B,H,T,Dk]; v [B,H,T,Dv]; beta [B,H,T];
g [B,H,T] (log-decay, <= 0); state S [B,H,Dk,Dv]. For t = 1..T:

    S <- S * exp(g_t)                      (only when g is given)
    u_t = beta_t * (v_t - S^T k_t)
    S <- S + k_t u_t^T
    o_t = S^T q_t                           (read after write)

The ops neither normalise nor scale their inputs: callers L2-normalise keys and keep
beta in (0, 1). The recurrence always runs in at least float32; outputs come back in
the input dtype and the final state stays in the compute dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from plasticlm.errors import PlasticError

DEFAULT_CHUNK_SIZE = 64
# up to this many tokens the token-by-token form is cheaper than one padded chunk
RECURRENT_MAX_T = 16


def _check(q, k, v, beta, g, initial_state) -> None:
    if q.dim() != 4 or k.shape != q.shape:
        raise PlasticError(f"q and k must both be [B,H,T,Dk]; got {tuple(q.shape)} and {tuple(k.shape)}")
    b, h, t, _ = q.shape
    if v.dim() != 4 or v.shape[:3] != (b, h, t):
        raise PlasticError(f"v must be [B,H,T,Dv] = [{b},{h},{t},Dv]; got {tuple(v.shape)}")
    if beta.shape != (b, h, t):
        raise PlasticError(f"beta must be [B,H,T] = [{b},{h},{t}]; got {tuple(beta.shape)}")
    if g is not None and g.shape != (b, h, t):
        raise PlasticError(f"g must be [B,H,T] = [{b},{h},{t}]; got {tuple(g.shape)}")
    want = (b, h, q.shape[-1], v.shape[-1])
    if initial_state is not None and tuple(initial_state.shape) != want:
        raise PlasticError(f"initial_state must be [B,H,Dk,Dv] = {list(want)}; got {tuple(initial_state.shape)}")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # float64 stays float64 (reference checks); anything narrower runs in float32.
    return torch.float64 if dtype == torch.float64 else torch.float32


def unit_lower_inverse(a: torch.Tensor) -> torch.Tensor:
    """(I + tril(a, -1))^-1 for a [..., C, C], C a power of two; a's diagonal and upper part
    are ignored. Built by block doubling (2 batched matmuls per level, log2 C levels):
    [[X11, 0], [M21, X22]] -> [[X11, 0], [-X22 M21 X11, X22]]. Used instead of LAPACK's
    batched triangular solve, which is orders of magnitude slower on a busy multi-threaded CPU.
    """
    c = a.shape[-1]
    batch = a.shape[:-2]
    inv = torch.ones(*batch, c, 1, 1, dtype=a.dtype, device=a.device)   # 1x1 diagonal blocks
    size = 1
    while size < c:
        n = c // (2 * size)
        blocks = a.reshape(*batch, n, 2 * size, n, 2 * size)
        blocks = torch.diagonal(blocks, dim1=-4, dim2=-2).movedim(-1, -3)  # [..., n, 2s, 2s]
        m21 = blocks[..., size:, :size]
        pairs = inv.reshape(*batch, n, 2, size, size)
        x11, x22 = pairs[..., 0, :, :], pairs[..., 1, :, :]
        x21 = -(x22 @ m21 @ x11)
        top = torch.cat([x11, torch.zeros_like(x11)], dim=-1)
        bottom = torch.cat([x21, x22], dim=-1)
        inv = torch.cat([top, bottom], dim=-2)
        size *= 2
    return inv.reshape(*batch, c, c)


def delta_rule_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    g: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token delta rule: returns o [B,H,T,Dv] and the final state [B,H,Dk,Dv].

    Cheap per token, so it is the decoding path; for training it keeps T copies of the
    state for backward — use :func:`delta_rule_chunkwise` there.
    """
    _check(q, k, v, beta, g, initial_state)
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    out_dtype = v.dtype
    cd = _compute_dtype(q.dtype)
    q, k, v, beta = (x.to(cd) for x in (q, k, v, beta))
    state = (torch.zeros(b, h, dk, dv, dtype=cd, device=q.device) if initial_state is None
             else initial_state.to(cd))
    decay = g.to(cd).exp() if g is not None else None
    decays = decay.unbind(2) if decay is not None else [None] * t
    outs = []
    for q_i, k_i, v_i, b_i, d_i in zip(q.unbind(2), k.unbind(2), v.unbind(2), beta.unbind(2), decays):
        if d_i is not None:
            state = state * d_i[..., None, None]
        predicted = (k_i[..., None, :] @ state).squeeze(-2)
        u = b_i[..., None] * (v_i - predicted)
        state = state + k_i[..., :, None] * u[..., None, :]
        outs.append((q_i[..., None, :] @ state).squeeze(-2))
    o = torch.stack(outs, dim=2) if outs else v.new_zeros(b, h, 0, dv)
    return o.to(out_dtype), state


def delta_rule_chunkwise(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    g: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunkwise delta rule via the UT transform: o [B,H,T,Dv], final state [B,H,Dk,Dv].

    Inside each chunk of C tokens the C sequential updates collapse to one triangular
    solve, (I + tril(diag(beta) K K^T * decay, -1)) [U | W] = [beta V | beta e^G K],
    done for all chunks at once (C a power of two); only the state hand-off between chunks is sequential
    (T/C steps of three matmuls). Any T: the tail is padded with beta = 0 (no write).
    """
    _check(q, k, v, beta, g, initial_state)
    if chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise PlasticError(f"chunk_size must be a power of two; got {chunk_size}")
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    out_dtype = v.dtype
    cd = _compute_dtype(q.dtype)
    q, k, v, beta = (x.to(cd) for x in (q, k, v, beta))
    gated = g is not None
    state = (torch.zeros(b, h, dk, dv, dtype=cd, device=q.device) if initial_state is None
             else initial_state.to(cd))
    if t == 0:
        return v.new_zeros(b, h, 0, dv), state

    c = chunk_size
    pad = (-t) % c
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta = F.pad(beta, (0, pad))
        g = F.pad(g.to(cd), (0, pad)) if gated else None
    n = (t + pad) // c
    q, k, v = (x.reshape(b, h, n, c, x.shape[-1]) for x in (q, k, v))
    beta = beta.reshape(b, h, n, c)
    k_beta = k * beta[..., None]
    if gated:
        cum = g.to(cd).reshape(b, h, n, c).cumsum(-1)            # G_t within each chunk
        causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        # exp(G_t - G_i) for i <= t; the upper part is masked before exp to avoid overflow.
        decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()
        # Unit lower-triangular system (the diagonal we leave in is ignored by the inverse).
        inverse = unit_lower_inverse((k_beta @ k.transpose(-1, -2)) * decay)
        u, w = inverse @ (v * beta[..., None]), inverse @ (k_beta * cum.exp()[..., None])
        intra = (q @ k.transpose(-1, -2)) * decay               # causal incl. diagonal
        q = q * cum.exp()[..., None]
        chunk_decay = cum[..., -1]                              # G_C per chunk [B,H,N]
        k_to_end = k * (chunk_decay[..., None] - cum).exp()[..., None]
        decays = chunk_decay.exp().unbind(2)
    else:
        # Without decay every mask and exponential drops out: the inverse ignores the upper
        # part by construction, and the intra-chunk scores only need the causal triangle.
        inverse = unit_lower_inverse(k_beta @ k.transpose(-1, -2))
        u, w = inverse @ (v * beta[..., None]), inverse @ k_beta
        intra = (q @ k.transpose(-1, -2)).tril()
        k_to_end = k
        decays = [None] * n
    # u [B,H,N,C,Dv], w [B,H,N,C,Dk]; unbind (not indexing) so that backward does not build
    # a full-size zero gradient per chunk
    per_chunk = zip(u.unbind(2), w.unbind(2), q.unbind(2), intra.unbind(2), decays,
                    k_to_end.transpose(-1, -2).unbind(2))
    outs = []
    for u_i, w_i, q_i, intra_i, decay_i, kt_i in per_chunk:
        u_i = u_i - w_i @ state                                 # the corrections actually written
        outs.append(q_i @ state + intra_i @ u_i)
        if decay_i is not None:
            state = state * decay_i[..., None, None]
        state = state + kt_i @ u_i
    o = torch.stack(outs, dim=2).reshape(b, h, n * c, dv)[:, :, :t]
    return o.to(out_dtype), state


def delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int | None = None,
    g: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Delta rule, o [B,H,T,Dv] and final state [B,H,Dk,Dv].

    Chunkwise (chunk ``chunk_size``, None = :data:`DEFAULT_CHUNK_SIZE`) for any T longer than
    :data:`RECURRENT_MAX_T` — in particular for every T > chunk — and token by token for
    shorter inputs (decoding steps), where the recurrent form is cheapest. ``g`` [B,H,T]
    (log-decay) turns it into the gated delta rule.
    """
    chunk = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
    if q.shape[2] > RECURRENT_MAX_T:
        return delta_rule_chunkwise(q, k, v, beta, initial_state, g=g, chunk_size=chunk)
    return delta_rule_recurrent(q, k, v, beta, initial_state, g=g)
