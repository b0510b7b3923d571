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
from plasticlm.memory.fla_bridge import HALF_DTYPES, delta_rule_fla, fla_chunk_delta_rule

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
    are ignored. Built by block doubling in place (2 batched matmuls per level, log2 C
    levels): [[X11, 0], [M21, X22]] -> [[X11, 0], [-X22 M21 X11, X22]], every diagonal block
    pair of a level at once through strided views. Used instead of LAPACK's batched
    triangular solve, which is slower here and orders of magnitude slower on a busy
    multi-threaded CPU.
    """
    c = a.shape[-1]
    batch = a.shape[:-2]
    a = a.contiguous()
    inv = torch.zeros_like(a)
    inv.diagonal(dim1=-2, dim2=-1).fill_(1)
    size = 1
    while size < c:
        n = c // (2 * size)
        # [..., n, 2, s, 2, s]: the n diagonal blocks of size 2s, as 2 x 2 grids of s x s
        pairs, m = (torch.diagonal(x.view(*batch, n, 2, size, n, 2, size), dim1=-6, dim2=-3)
                    .movedim(-1, -5) for x in (inv, a))
        # clones, since later levels write into inv, which autograd (the gated form) saved
        x11, x22 = pairs[..., 0, :, 0, :].clone(), pairs[..., 1, :, 1, :].clone()
        pairs[..., 1, :, 0, :] = -(x22 @ m[..., 1, :, 0, :] @ x11)
        size *= 2
    return inv


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
    done for all chunks at once (C a power of two); only the state hand-off between chunks
    is sequential (T/C steps of two matmuls without decay, four with). Without decay (``g``
    None) the backward is hand-written; the gated form goes through autograd. Any T: the tail is padded with
    beta = 0 (no write).
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
    if not gated:
        o, state = _UngatedChunks.apply(q, k, v, beta, state)
        return o.reshape(b, h, n * c, dv)[:, :, :t].to(out_dtype), state
    k_beta = k * beta[..., None]
    cum = g.to(cd).reshape(b, h, n, c).cumsum(-1)                # G_t within each chunk
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    # exp(G_t - G_i) for i <= t; the upper part is masked before exp to avoid overflow.
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    # Unit lower-triangular system (the diagonal we leave in is ignored by the inverse).
    inverse = unit_lower_inverse((k_beta @ k.transpose(-1, -2)) * decay)
    u, w = inverse @ (v * beta[..., None]), inverse @ (k_beta * cum.exp()[..., None])
    intra = (q @ k.transpose(-1, -2)) * decay                   # causal incl. diagonal
    q = q * cum.exp()[..., None]
    chunk_decay = cum[..., -1]                                  # G_C per chunk [B,H,N]
    k_to_end = k * (chunk_decay[..., None] - cum).exp()[..., None]
    decays = chunk_decay.exp().unbind(2)
    # u [B,H,N,C,Dv], w [B,H,N,C,Dk]; unbind (not indexing) so that backward does not build
    # a full-size zero gradient per chunk
    per_chunk = zip(u.unbind(2), w.unbind(2), q.unbind(2), intra.unbind(2), decays,
                    k_to_end.transpose(-1, -2).unbind(2))
    outs = []
    for u_i, w_i, q_i, intra_i, decay_i, kt_i in per_chunk:
        u_i = u_i - w_i @ state                                 # the corrections actually written
        outs.append(q_i @ state + intra_i @ u_i)
        state = state * decay_i[..., None, None]
        state = state + kt_i @ u_i
    o = torch.stack(outs, dim=2).reshape(b, h, n * c, dv)[:, :, :t]
    return o.to(out_dtype), state


def _flat(x: torch.Tensor) -> torch.Tensor:
    # [B,H,N,...] -> [B*H,N,...]: baddbmm wants one batch dimension
    return x.reshape(-1, *x.shape[2:])


class _UngatedChunks(torch.autograd.Function):
    """The ungated chunkwise delta rule on chunked inputs, with a hand-written backward.

    q, k [B,H,N,C,Dk], v [B,H,N,C,Dv], beta [B,H,N,C], state [B,H,Dk,Dv] -> o [B,H,N,C,Dv]
    and the final state. Forward keeps the state entering each chunk ([B,H,N,Dk,Dv], as
    flash-linear-attention's ``h``), so that only the two matmuls of the state hand-off stay
    sequential, both ways; autograd through the loop recorded every small op of it instead.
    """

    @staticmethod
    def forward(ctx, q, k, v, beta, state):
        # the recurrence runs in the inputs' float32/64 even under autocast (and baddbmm's
        # out= needs one dtype)
        with torch.autocast(q.device.type, enabled=False):
            return _UngatedChunks._forward(ctx, q, k, v, beta, state)

    @staticmethod
    def _forward(ctx, q, k, v, beta, state):
        k_beta = k * beta[..., None]
        inverse = unit_lower_inverse(k_beta @ k.transpose(-1, -2))
        u, w = inverse @ (v * beta[..., None]), inverse @ k_beta
        bh, n = q.shape[0] * q.shape[1], q.shape[2]
        u_f, w_f, k_f = _flat(u), _flat(w), _flat(k)
        states = state.new_empty(bh, n, *state.shape[2:])
        written = torch.empty_like(u_f)           # u - w S: the corrections actually written
        s = state.reshape(bh, *state.shape[2:])
        for i in range(n):
            states[:, i] = s
            torch.baddbmm(u_f[:, i], w_f[:, i], s, alpha=-1, out=written[:, i])
            s = torch.baddbmm(s, k_f[:, i].transpose(-1, -2), written[:, i])
        states = states.view(*q.shape[:3], *state.shape[2:])
        written = written.view_as(u)
        o = q @ states + (q @ k.transpose(-1, -2)).tril() @ written
        ctx.save_for_backward(q, k, v, beta, inverse, w, states, written)
        return o, s.view_as(state)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, d_final):
        with torch.autocast(d_o.device.type, enabled=False):
            return _UngatedChunks._backward(ctx, d_o.to(ctx.saved_tensors[0].dtype), d_final)

    @staticmethod
    def _backward(ctx, d_o, d_final):
        q, k, v, beta, inverse, w, states, written = ctx.saved_tensors
        kt = k.transpose(-1, -2)
        intra = (q @ kt).tril()
        bh, n = q.shape[0] * q.shape[1], q.shape[2]
        # The reverse scan: d_written_i = intra_i^T dO_i + k_i dS_{i+1};
        # dS_i = dS_{i+1} + q_i^T dO_i - w_i^T d_written_i.
        from_out = _flat(intra.transpose(-1, -2) @ d_o)
        from_read = _flat(q.transpose(-1, -2) @ d_o)
        k_f, w_f = _flat(k), _flat(w)
        d_written = torch.empty_like(from_out)
        d_next = torch.empty_like(_flat(states))    # dS_{i+1} for each chunk i
        ds = d_final.reshape(bh, *states.shape[3:])          # zeros when the state is unused
        for i in reversed(range(n)):
            d_next[:, i] = ds
            torch.baddbmm(from_out[:, i], k_f[:, i], ds, out=d_written[:, i])
            ds = torch.baddbmm(ds + from_read[:, i], w_f[:, i].transpose(-1, -2), d_written[:, i],
                               alpha=-1)
        d_written = d_written.view_as(written)
        d_next = d_next.view_as(states)
        d_intra = (d_o @ written.transpose(-1, -2)).tril()
        d_q = d_o @ states.transpose(-1, -2) + d_intra @ k
        d_k = written @ d_next.transpose(-1, -2) + d_intra.transpose(-1, -2) @ q
        d_w = -(d_written @ states.transpose(-1, -2))
        # u = T^-1 (beta v), w = T^-1 (beta k), T^-1 = (I + tril(beta k k^T, -1))^-1
        k_beta, v_beta = k * beta[..., None], v * beta[..., None]
        inv_t = inverse.transpose(-1, -2)
        d_v_beta, d_k_beta = inv_t @ d_written, inv_t @ d_w
        d_inverse = d_written @ v_beta.transpose(-1, -2) + d_w @ k_beta.transpose(-1, -2)
        d_a = -(inv_t @ d_inverse @ inv_t).tril(-1)
        d_k_beta = d_k_beta + d_a @ k
        d_k = d_k + d_a.transpose(-1, -2) @ k_beta + d_k_beta * beta[..., None]
        d_beta = (d_k_beta * k).sum(-1) + (d_v_beta * v).sum(-1)
        d_state = ds.view(states.shape[:2] + states.shape[3:])
        return d_q, d_k, d_v_beta * beta[..., None], d_beta, d_state


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

    Chunkwise for any T longer than :data:`RECURRENT_MAX_T` — in particular for every
    T > chunk — and token by token for shorter inputs (decoding steps), where the recurrent
    form is cheapest. ``g`` [B,H,T] (log-decay) turns it into the gated delta rule. The
    chunkwise form is fla's kernel where :func:`chunkwise_backend` says so (CUDA, bf16/fp16,
    ungated; ``chunk_size`` is then fla's own), else the torch op with chunk ``chunk_size``
    (None = :data:`DEFAULT_CHUNK_SIZE`).
    """
    chunk = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
    if q.shape[2] <= RECURRENT_MAX_T:
        return delta_rule_recurrent(q, k, v, beta, initial_state, g=g)
    if chunkwise_backend(q, g) == "fla":
        _check(q, k, v, beta, g, initial_state)
        return delta_rule_fla(q, k, v, beta, initial_state)
    return delta_rule_chunkwise(q, k, v, beta, initial_state, g=g, chunk_size=chunk)


def chunkwise_backend(q: torch.Tensor, g: torch.Tensor | None = None) -> str:
    """"fla" for ungated bf16/fp16 inputs on CUDA when fla imports, else "torch". float32
    and float64 inputs (training masters, reference checks) stay on the torch op: fla's
    kernels refuse them, and rounding them to bf16 would change results."""
    if q.is_cuda and g is None and q.dtype in HALF_DTYPES and fla_chunk_delta_rule() is not None:
        return "fla"
    return "torch"
