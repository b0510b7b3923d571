"""The memory-light scoring and training loss (plasticlm.eval.lm_head) against the reference:
full [B, T, V] logits from the model's own forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from plasticlm.eval.lm_head import chunked_cross_entropy, hidden_states, selected_logits
from plasticlm.eval.scoring import last_token_logprobs, next_token_logprobs, score_continuations
from plasticlm.fednl.objective import answer_loss
from plasticlm.models import build_tiny
from plasticlm.models.shapes import build_shape

TOL = 1e-4


@pytest.fixture(scope="module")
def tiny():
    return build_tiny("qwen3", seed=0, vocab_size=300, hidden_size=64, num_layers=2,
                      num_heads=4)


@pytest.fixture(scope="module")
def qwen_shape():
    """Qwen2.5-0.5B's shape cut to 2 layers: 151,936-wide logits."""
    return build_shape("qwen2.5-0.5b", num_layers=2, tokenizer=None)


def _batch(vocab: int, lengths: list[int], seed: int = 0, left: bool = False):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, n in enumerate(lengths):
        span = slice(width - n, width) if left else slice(0, n)
        ids[r, span] = torch.randint(1, vocab, (n,), generator=g)
        mask[r, span] = 1
    return ids, mask


@torch.no_grad()
def _reference_next(model, ids, mask):
    """next_token_logprobs as it was: full logits at every position."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                   use_cache=False).logits[:, :-1].float()
    target = ids[:, 1:]
    logp = logits.gather(-1, target[..., None]).squeeze(-1) - logits.logsumexp(-1)
    real = mask[:, 1:].bool() & mask[:, :-1].bool()
    return torch.where(real, logp, torch.zeros_like(logp)), (logits.argmax(-1) == target) & real


def _reference_loss(model, ids, labels):
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                           ignore_index=-100)


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("which", ["tiny", "qwen_shape"])
def test_next_and_last_token_logprobs_match_full_logits(which, left, request):
    model = request.getfixturevalue(which)
    ids, mask = _batch(300, [7, 4, 6], seed=1, left=left)
    logp, greedy = next_token_logprobs(model, ids, mask)
    ref_logp, ref_greedy = _reference_next(model, ids, mask)
    assert torch.allclose(logp, ref_logp, atol=TOL)
    assert torch.equal(greedy, ref_greedy)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask,
                     position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits.float()
    last = mask.shape[1] - 1 - mask.flip(-1).argmax(-1)
    ref_last = full[torch.arange(3), last].log_softmax(-1)
    out = last_token_logprobs(model, ids, mask)
    assert out.shape == (3, model.config.vocab_size)
    assert torch.allclose(out, ref_last, atol=TOL)


def test_scored_mask_computes_only_its_positions(tiny):
    ids, mask = _batch(300, [8, 5], seed=2)
    scored = torch.zeros(2, 7, dtype=torch.bool)
    scored[0, 5:7] = scored[1, 2:4] = True
    logp, _ = next_token_logprobs(tiny, ids, mask, scored)
    ref, _ = _reference_next(tiny, ids, mask)
    assert torch.allclose(logp[scored], ref[scored], atol=TOL)
    assert torch.all(logp[~scored] == 0)


@pytest.mark.parametrize("side", ["right", "left"])
def test_score_continuations_matches_full_logits(tiny, side):
    g = torch.Generator().manual_seed(3)
    contexts = [torch.randint(1, 300, (n,), generator=g).tolist() for n in (5, 3, 6, 4)]
    conts = [torch.randint(1, 300, (n,), generator=g).tolist() for n in (2, 3, 1, 2)]
    got = score_continuations(tiny, contexts, conts, batch_size=3, padding_side=side)
    for ctx, cont, s in zip(contexts, conts, got):
        ids = torch.tensor([ctx + cont])
        logp, greedy = _reference_next(tiny, ids, torch.ones_like(ids))
        span = slice(len(ctx) - 1, len(ctx) + len(cont) - 1)
        assert s.logprob == pytest.approx(float(logp[0, span].sum()), abs=TOL)
        assert s.greedy == bool(greedy[0, span].all())


@pytest.mark.parametrize("which", ["tiny", "qwen_shape"])
def test_answer_loss_and_gradients_match_full_logits(which, request):
    model = request.getfixturevalue(which)
    ids, _ = _batch(300, [6, 6, 6], seed=4)
    labels = torch.full_like(ids, -100)
    labels[0, 3:6], labels[1, 5], labels[2, 1:4] = ids[0, 3:6], ids[1, 5], ids[2, 1:4]
    params = [p for p in model.parameters()][-3:]  # the final norm and the top layer's MLP
    for p in params:
        p.requires_grad_(True)
    loss = answer_loss(model, ids, labels)
    grads = torch.autograd.grad(loss, params)
    ref = _reference_loss(model, ids, labels)
    ref_grads = torch.autograd.grad(ref, params)
    assert float(loss) == pytest.approx(float(ref), abs=TOL)
    for a, b in zip(grads, ref_grads):
        assert torch.allclose(a, b, atol=TOL)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 40), chunk=st.integers(1, 17), seed=st.integers(0, 100))
def test_chunked_cross_entropy_equals_one_shot(tiny, n, chunk, seed):
    """Any chunk size, ragged last chunk included: the value and both gradients (hidden states
    and a trainable head) equal one cross-entropy over all N rows."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, 64, generator=g, requires_grad=True)
    targets = torch.randint(0, 300, (n,), generator=g)
    head = tiny.get_output_embeddings().weight
    head.requires_grad_(True)
    try:
        loss = chunked_cross_entropy(tiny, hidden, targets, chunk=chunk)
        gh, gw = torch.autograd.grad(loss, [hidden, head])
        ref = F.cross_entropy(selected_logits(tiny, hidden), targets, reduction="sum")
        rh, rw = torch.autograd.grad(ref, [hidden, head])
    finally:
        head.requires_grad_(False)
    assert float(loss) == pytest.approx(float(ref), rel=1e-5, abs=TOL)
    assert torch.allclose(gh, rh, atol=TOL) and torch.allclose(gw, rw, atol=TOL)


def test_hidden_states_skip_the_full_head(tiny):
    """The head sees one position per row in the forward that hidden_states runs."""
    seen = []
    handle = tiny.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: seen.append(tuple(args[0].shape)))
    try:
        h = hidden_states(tiny, torch.randint(1, 300, (2, 9)))
    finally:
        handle.remove()
    assert h.shape == (2, 9, 64)
    assert seen == [(2, 1, 64)]
