"""Delta-rule ops: chunkwise == recurrent == the float64 naive loop (memory/naive.py), values
and gradients."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from plasticlm.errors import PlasticError
from plasticlm.memory.naive import delta_rule_naive as naive
from plasticlm.memory.ops import (
    delta_rule,
    delta_rule_chunkwise,
    delta_rule_recurrent,
    unit_lower_inverse,
)


def inputs(b, h, t, dk, dv, seed, dtype=torch.float32, gated=False, with_state=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, dk, generator=gen, dtype=dtype)
    k = F.normalize(torch.randn(b, h, t, dk, generator=gen, dtype=dtype), dim=-1)
    v = torch.randn(b, h, t, dv, generator=gen, dtype=dtype)
    beta = torch.rand(b, h, t, generator=gen, dtype=dtype)
    g = -torch.rand(b, h, t, generator=gen, dtype=dtype) * 0.5 if gated else None
    s0 = torch.randn(b, h, dk, dv, generator=gen, dtype=dtype) * 0.5 if with_state else None
    return q, k, v, beta, g, s0


@settings(max_examples=12, deadline=None)
@given(
    b=st.integers(1, 2), h=st.integers(1, 3), t=st.integers(1, 45), dk=st.sampled_from([4, 8, 16]),
    dv=st.sampled_from([3, 8]), chunk=st.sampled_from([4, 8, 16]), gated=st.booleans(),
    with_state=st.booleans(), seed=st.integers(0, 10_000),
)
def test_chunkwise_and_recurrent_match_naive_float32(b, h, t, dk, dv, chunk, gated, with_state, seed):
    q, k, v, beta, g, s0 = inputs(b, h, t, dk, dv, seed, gated=gated, with_state=with_state)
    ref_o, ref_s = naive(q, k, v, beta, s0, g)
    for o, s in (delta_rule_recurrent(q, k, v, beta, s0, g=g),
                 delta_rule_chunkwise(q, k, v, beta, s0, g=g, chunk_size=chunk)):
        assert o.dtype == torch.float32 and s.dtype == torch.float32
        torch.testing.assert_close(o.double(), ref_o, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(s.double(), ref_s, atol=1e-5, rtol=1e-5)


@settings(max_examples=8, deadline=None)
@given(t=st.integers(1, 70), chunk=st.sampled_from([8, 16, 32]), gated=st.booleans(), seed=st.integers(0, 999))
def test_chunkwise_equals_recurrent_float64(t, chunk, gated, seed):
    q, k, v, beta, g, s0 = inputs(2, 2, t, 8, 6, seed, dtype=torch.float64, gated=gated, with_state=True)
    o1, s1 = delta_rule_recurrent(q, k, v, beta, s0, g=g)
    o2, s2 = delta_rule_chunkwise(q, k, v, beta, s0, g=g, chunk_size=chunk)
    torch.testing.assert_close(o1, o2, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(s1, s2, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("gated", [False, True])
def test_gradients_match_naive(gated):
    t = 23  # not a multiple of the chunk
    q, k, v, beta, g, s0 = inputs(1, 2, t, 8, 5, seed=3, gated=gated, with_state=True)
    w_o = torch.randn(1, 2, t, 5)
    w_s = torch.randn(1, 2, 8, 5)

    def grads(fn, dtype):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v, beta, s0)]
        gg = g.detach().to(dtype).requires_grad_() if gated else None
        o, s = fn(*leaves[:4], leaves[4], gg)
        ((o * w_o.to(dtype)).sum() + (s * w_s.to(dtype)).sum()).backward()
        return [x.grad.double() for x in leaves] + ([gg.grad.double()] if gated else [])

    ref = grads(naive, torch.float64)
    rec = grads(lambda *a: delta_rule_recurrent(*a[:5], g=a[5]), torch.float32)
    chk = grads(lambda *a: delta_rule_chunkwise(*a[:5], g=a[5], chunk_size=8), torch.float32)
    for r, a, c in zip(ref, rec, chk):
        torch.testing.assert_close(a, r, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(c, r, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("gated", [False, True])
def test_gradcheck_chunkwise_float64(gated):
    """The ungated path's hand-written backward and the gated one's autograd, against finite
    differences, through the padded tail and the initial state."""
    q, k, v, beta, g, s0 = inputs(1, 2, 11, 3, 2, seed=5, dtype=torch.float64, gated=gated,
                                  with_state=True)
    args = [x.requires_grad_() for x in (q, k, v, beta, s0)] + ([g.requires_grad_()] if gated else [])
    assert torch.autograd.gradcheck(
        lambda q, k, v, b, s, g=None: delta_rule_chunkwise(q, k, v, b, s, g=g, chunk_size=4), args)


@settings(max_examples=10, deadline=None)
@given(t=st.integers(17, 90), chunk=st.sampled_from([4, 16, 32]), with_state=st.booleans(),
       seed=st.integers(0, 999))
def test_ungated_backward_equals_recurrent_autograd_float64(t, chunk, with_state, seed):
    q, k, v, beta, _, s0 = inputs(2, 2, t, 8, 6, seed, dtype=torch.float64, with_state=with_state)
    w_o = torch.randn(2, 2, t, 6, dtype=torch.float64)
    w_s = torch.randn(2, 2, 8, 6, dtype=torch.float64)

    def grads(fn):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, beta)]
        s = s0.detach().clone().requires_grad_() if with_state else None
        o, final = fn(*leaves, s)
        ((o * w_o).sum() + (final * w_s).sum()).backward()
        return [x.grad for x in leaves] + ([s.grad] if with_state else [])

    for a, r in zip(grads(lambda *x: delta_rule_chunkwise(*x, chunk_size=chunk)),
                    grads(delta_rule_recurrent)):
        torch.testing.assert_close(a, r, atol=1e-10, rtol=1e-10)


def test_ungated_path_keeps_float32_under_autocast():
    """Autocast must not reach the recurrence: the same outputs and gradients as without it."""
    q, k, v, beta, _, s0 = inputs(1, 2, 40, 8, 8, seed=4, with_state=True)

    def run():
        leaves = [x.clone().requires_grad_() for x in (q, k, v, beta, s0)]
        o, s = delta_rule_chunkwise(*leaves[:4], leaves[4], chunk_size=16)
        (o.sum() + s.sum()).backward()
        return [o, s] + [x.grad for x in leaves]

    plain = run()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = run()
    for a, b in zip(plain, cast):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)


def test_bfloat16_inputs_keep_float32_state():
    q, k, v, beta, _, s0 = inputs(1, 2, 40, 8, 8, seed=1, with_state=True)
    o, s = delta_rule(q.bfloat16(), k.bfloat16(), v.bfloat16(), beta.bfloat16(), s0, chunk_size=16)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    ref_o, _ = naive(q.bfloat16(), k.bfloat16(), v.bfloat16(), beta.bfloat16(), s0)
    torch.testing.assert_close(o.double(), ref_o, atol=3e-2, rtol=3e-2)


def test_dispatch_and_state_carry_over():
    """Two halves with the state handed over == the whole; short inputs take the recurrent path."""
    q, k, v, beta, _, _ = inputs(1, 2, 50, 8, 8, seed=2)
    whole, s_whole = delta_rule(q, k, v, beta, chunk_size=16)
    first, s_mid = delta_rule(q[:, :, :30], k[:, :, :30], v[:, :, :30], beta[:, :, :30], chunk_size=16)
    second, s_end = delta_rule(q[:, :, 30:], k[:, :, 30:], v[:, :, 30:], beta[:, :, 30:], s_mid, chunk_size=32)
    torch.testing.assert_close(torch.cat([first, second], 2), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_end, s_whole, atol=1e-5, rtol=1e-5)


def test_matches_transformers_reference_with_zero_decay():
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    q, k, v, beta, _, s0 = inputs(1, 2, 37, 16, 16, seed=4, with_state=True)
    # the reference scales q by Dk^-0.5 itself and uses [B,T,H,D]
    o_ref, s_ref = torch_chunk_gated_delta_rule(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), torch.zeros(1, 37, 2),
        beta.transpose(1, 2), initial_state=s0, output_final_state=True)
    o, s = delta_rule_chunkwise(q * 16 ** -0.5, k, v, beta, s0, chunk_size=16)
    torch.testing.assert_close(o, o_ref.transpose(1, 2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s, s_ref, atol=1e-5, rtol=1e-5)


@settings(max_examples=10, deadline=None)
@given(log_c=st.integers(0, 6), seed=st.integers(0, 999))
def test_unit_lower_inverse(log_c, seed):
    c = 2 ** log_c
    a = torch.randn(3, c, c, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 0.3
    system = a.tril(-1) + torch.eye(c, dtype=torch.float64)
    torch.testing.assert_close(unit_lower_inverse(a) @ system, torch.eye(c, dtype=torch.float64).expand(3, c, c))


def test_state_is_bounded_with_normalised_keys():
    """With unit keys and beta in (0,1) the transition I - beta k k^T is a contraction."""
    q, k, v, beta, _, _ = inputs(1, 1, 2000, 16, 16, seed=9)
    _, s = delta_rule_chunkwise(q, k, v, beta, chunk_size=64)
    assert torch.isfinite(s).all() and s.abs().max() < 100


def test_bad_shapes_and_chunk_raise():
    q, k, v, beta, _, _ = inputs(1, 2, 10, 8, 8, seed=0)
    with pytest.raises(PlasticError, match="beta"):
        delta_rule(q, k, v, beta[:, :1])
    with pytest.raises(PlasticError, match="initial_state"):
        delta_rule(q, k, v, beta, torch.zeros(1, 2, 8, 7))
    with pytest.raises(PlasticError, match="power of two"):
        delta_rule_chunkwise(q, k, v, beta, chunk_size=12)
