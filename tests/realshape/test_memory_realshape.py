"""Memory attention on the published shapes: left padding changes nothing under the eager,
sdpa and flex_attention backends (float32), and stays close in bfloat16."""

import pytest
import torch
import transformers.masking_utils as masking_utils

from plasticlm.memory import attach_memory, meta_parameters
from plasticlm.memory.checks import left_padding_gap

T = 12  # the longer row; the shorter one is left-padded by 4


@pytest.fixture(autouse=True)
def eager_block_masks(monkeypatch):
    """flex_attention's BlockMask built without torch.compile (slow on the CPU); the memory
    layers do not read it."""
    build = masking_utils.create_block_mask
    monkeypatch.setattr(masking_utils, "create_block_mask",
                        lambda *a, _compile=False, **k: build(*a, _compile=False, **k))


def _rows(vocab: int):
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(1, vocab, (t,), generator=gen) for t in (T - 4, T)]


def test_memory_left_padding_under_every_backend(shape, shape_model):
    model, tokenizer = shape_model(shape)
    attach_memory(model, layers="all", window=8, rank=4, gate_init=0.0)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        for name, p in meta_parameters(model).items():
            if "lora" in name:
                p.add_(0.1 * torch.randn_like(p))
    seqs = _rows(len(tokenizer))
    for impl in ("eager", "sdpa", "flex_attention"):
        model.set_attn_implementation(impl)
        assert left_padding_gap(model, seqs) <= 1e-4, impl
    model.set_attn_implementation("sdpa")
    model.to(torch.bfloat16)
    assert left_padding_gap(model, seqs) <= 0.25  # bf16: rows batched or alone round differently
