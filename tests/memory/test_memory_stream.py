"""Streaming: chunk-by-chunk logits == parallel windowed forward; bounded state; save/restore."""

import pytest
import torch

from plasticlm.errors import PlasticError
from plasticlm.memory import MemoryStream, attach_memory, meta_parameters, window_attention_mask
from plasticlm.models import build_tiny

SIZES = dict(vocab_size=80, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
             max_position_embeddings=64)  # streams run past this: RoPE has no hard limit


def memory_model(arch="qwen3", window=6, conv_size=3, **options):
    model = attach_memory(build_tiny(arch, seed=1, **SIZES), layers=[1], window=window, rank=4,
                          conv_size=conv_size, **options)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an open gate and non-zero LoRA, so the memory really matters
        for name, p in meta_parameters(model).items():
            if name.endswith("gate_logit"):
                p.fill_(0.0)
            elif ".B" in name or "conv" in name or "gate_proj" in name or "decay_proj.weight" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    return model


def tokens(t, b=2, seed=0):
    return torch.randint(0, SIZES["vocab_size"], (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch,chunk", [("llama", 1), ("qwen2", 7), ("qwen3", 32), ("qwen3", 100)])
def test_stream_equals_parallel_windowed_forward(arch, chunk):
    model = memory_model(arch)
    x = tokens(70)
    with torch.no_grad():
        parallel = model(x).logits
    streamed = MemoryStream(model, chunk_tokens=chunk).feed(x)
    torch.testing.assert_close(streamed, parallel, atol=1e-4, rtol=1e-4)
    assert (parallel[:, -1] - model(x[:, -10:]).logits[:, -1]).abs().max() > 1e-3  # memory carries the past


@pytest.mark.parametrize("options", [dict(decay=True, decay_init=1.0), dict(gate="input"),
                                     dict(lora_scope="shared")])
def test_stream_equals_parallel_with_memory_options(options):
    """The gated delta rule, the input-dependent gate and the shared LoRA carry their state
    across chunks exactly like the plain memory."""
    model = memory_model("qwen2", **options)
    x = tokens(50)
    with torch.no_grad():
        parallel = model(x).logits
    streamed = MemoryStream(model, chunk_tokens=9).feed(x)
    torch.testing.assert_close(streamed, parallel, atol=1e-4, rtol=1e-4)


def test_plain_model_streams_with_window():
    base = build_tiny("llama", seed=2, **SIZES)
    x = tokens(50, b=1)
    with torch.no_grad():
        windowed = base(x, attention_mask=window_attention_mask(50, 8)).logits
    stream = MemoryStream(base, window=8, chunk_tokens=13)
    torch.testing.assert_close(stream.feed(x), windowed, atol=1e-5, rtol=1e-5)


def test_state_does_not_grow_with_the_stream():
    stream = MemoryStream(memory_model(window=8), chunk_tokens=16)
    stream.feed(tokens(40, b=1))
    size_after_40 = stream.state_bytes()
    stream.feed(tokens(200, b=1, seed=1), keep="last")
    assert stream.position == 240
    assert stream.state_bytes() == size_after_40
    assert stream.states[0].keys.shape[2] == 7  # W - 1 past tokens


def test_generate_matches_parallel_greedy():
    model = memory_model("llama")
    prompt = tokens(20, b=1)
    stream = MemoryStream(model)
    stream.feed(prompt)
    new = stream.generate(5)
    seq = prompt
    with torch.no_grad():
        for _ in range(5):
            seq = torch.cat([seq, model(seq).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(new, seq[:, 20:])


def test_save_restore_and_reset(tmp_path):
    model = memory_model("qwen2")
    x = tokens(60)
    stream = MemoryStream(model, chunk_tokens=9)
    whole = stream.feed(x)
    stream.reset()
    stream.feed(x[:, :35])
    path = stream.save(tmp_path / "stream.safetensors")
    rest = stream.feed(x[:, 35:])
    torch.testing.assert_close(rest, whole[:, 35:], atol=1e-5, rtol=1e-5)
    other = MemoryStream(model)
    other.load(path)
    assert other.position == 35
    torch.testing.assert_close(other.feed(x[:, 35:]), rest, atol=1e-6, rtol=1e-6)


def test_stream_errors():
    model = memory_model(window=6)
    with pytest.raises(PlasticError, match="window=6"):
        MemoryStream(model, window=8)
    with pytest.raises(PlasticError, match="needs window"):
        MemoryStream(build_tiny("llama", **SIZES))
    with pytest.raises(PlasticError, match="feed"):
        MemoryStream(model).generate(2)


def test_feeding_with_grad_reaches_earlier_chunks_until_detached():
    """``feed(grad=True)`` records the forward through the carried state: a loss on the second
    chunk has a gradient with respect to the first chunk's hidden states (through the memory
    and the window cache); after ``detach()`` it has none, and the state keeps its values."""
    model = memory_model("qwen3")
    emb = model.get_input_embeddings()
    emb.weight.requires_grad_(True)  # frozen by attach_memory; here it marks each chunk's path
    seen = []

    def keep(module, inputs, out):
        out.retain_grad()
        seen.append(out)

    hook = emb.register_forward_hook(keep)
    x = tokens(24, b=1)

    def grad_into_first_chunk(cut: bool) -> float:
        seen.clear()
        stream = MemoryStream(model, chunk_tokens=12)
        stream.feed(x[:, :12], grad=True)
        if cut:
            before = {k: v.clone() for k, v in stream.state_dict().items()}
            stream.detach()
            assert all(torch.equal(before[k], v) for k, v in stream.state_dict().items())
        stream.feed(x[:, 12:], grad=True)[:, -1].sum().backward()
        first = seen[0].grad
        return 0.0 if first is None else first.abs().sum().item()

    try:
        assert grad_into_first_chunk(cut=False) > 1e-6
        assert grad_into_first_chunk(cut=True) == 0.0
    finally:
        hook.remove()
        emb.weight.requires_grad_(False)
    assert not MemoryStream(model, chunk_tokens=12).feed(x).requires_grad
