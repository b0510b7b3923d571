"""Memory attention under every attention backend, the padding hook, meta-device loading and
the fla dispatch of the delta rule."""

import importlib.util

import pytest
import torch
import transformers.masking_utils as masking_utils
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

from plasticlm.errors import PlasticError
from plasticlm.memory import (
    attach_memory,
    delta_rule,
    delta_rule_chunkwise,
    fla_bridge,
    from_pretrained,
    load_theta,
    meta_parameters,
    ops,
    reset_theta,
    save_pretrained,
    window_attention_mask,
)
from plasticlm.models import build_tiny

SIZES = dict(vocab_size=96, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
             max_position_embeddings=256)
# flash-attention-2's masks (2D or None) in front of the sdpa kernel: that backend's mask
# path on any machine
FA2_MASKS = "plasticlm_fa2_masks"
AttentionInterface.register(FA2_MASKS, sdpa_attention_forward)
AttentionMaskInterface.register(FA2_MASKS, flash_attention_mask)
HAS_FA2 = torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None
BACKENDS = ["eager", "sdpa", "flex_attention", FA2_MASKS, pytest.param(
    "flash_attention_2", marks=pytest.mark.skipif(not HAS_FA2, reason="needs CUDA and flash_attn"))]


@pytest.fixture(autouse=True)
def eager_block_masks(monkeypatch):
    """flex_attention's BlockMask built without torch.compile (which costs ~25 s per shape on
    the CPU): the same mask object, and the memory layers do not read it anyway."""
    build = masking_utils.create_block_mask
    monkeypatch.setattr(masking_utils, "create_block_mask",
                        lambda *a, _compile=False, **k: build(*a, _compile=False, **k))


def ids(t, b=1, seed=0):
    return torch.randint(1, SIZES["vocab_size"], (b, t), generator=torch.Generator().manual_seed(seed))


def memory_model(arch="llama", impl="eager", device="cpu", **options):
    """Open gate and a trained-looking theta, so that a padding leak shows."""
    model = build_tiny(arch, **SIZES).to(device)
    model.set_attn_implementation(impl)
    options = dict(layers="all", window=4, rank=4, gate_init=0.0, conv_size=4) | options
    attach_memory(model, **options)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)
        for name, p in meta_parameters(model).items():
            if "lora" in name or "conv" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def left_padded(seqs: list[torch.Tensor], pad_id=7):
    """[B, T] ids left-padded with a real (nonzero) token, the 2D mask and the positions."""
    t = max(len(s) for s in seqs)
    batch = torch.stack([torch.cat([torch.full((t - len(s),), pad_id), s]) for s in seqs])
    mask = torch.stack([torch.cat([torch.zeros(t - len(s)), torch.ones(len(s))]) for s in seqs]).long()
    return batch, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def assert_padding_free(model, atol=1e-4, seqs=None):
    """Each row's real-token hidden states and last logits, padded in a batch, equal those of
    the row alone; padding positions stay finite."""
    device = next(model.parameters()).device
    seqs = seqs or [ids(7, seed=1)[0], ids(10, seed=2)[0]]
    batch, mask, positions = (x.to(device) for x in left_padded(seqs))
    with torch.no_grad():
        hidden = model.get_decoder()(batch, attention_mask=mask, position_ids=positions).last_hidden_state
        last = model(batch, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits[:, -1]
        assert torch.isfinite(hidden).all()
        for row, seq in enumerate(seqs):
            seq = seq[None].to(device)
            alone = model.get_decoder()(seq).last_hidden_state[0]
            torch.testing.assert_close(hidden[row, -seq.shape[1]:], alone, atol=atol, rtol=atol)
            torch.testing.assert_close(last[row], model(seq, logits_to_keep=1).logits[0, -1],
                                       atol=atol, rtol=atol)


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_left_padding_changes_nothing_under_every_backend(arch, impl):
    device = "cuda" if impl == "flash_attention_2" else "cpu"
    model = memory_model(arch, impl, device)
    assert model.config._attn_implementation == impl
    assert_padding_free(model)


def test_padding_leaks_without_the_mask():
    """The check above can fail: the same batch without its mask differs from the rows alone."""
    model = memory_model()
    seqs = [ids(7, seed=1)[0], ids(10, seed=2)[0]]
    batch, mask, positions = left_padded(seqs)
    with torch.no_grad():
        leaky = model.get_decoder()(batch, position_ids=positions).last_hidden_state[0, -7:]
        alone = model.get_decoder()(seqs[0][None]).last_hidden_state[0]
    assert (leaky - alone).abs().max() > 1e-2


@pytest.mark.parametrize("impl", ["eager", "flex_attention", FA2_MASKS])
def test_mask_is_set_on_every_decoder_call(impl):
    """A padded call, through the model or the bare decoder, followed by an unpadded call of
    the same shape through the decoder: the second call uses no padding."""
    model = memory_model(impl=impl)
    batch, mask, positions = left_padded([ids(7, seed=1)[0], ids(10, seed=2)[0]])
    other = ids(10, b=2, seed=3)
    decoder = model.get_decoder()
    with torch.no_grad():
        expected = decoder(other).last_hidden_state
        masked = decoder(other, attention_mask=mask).last_hidden_state
        assert (masked - expected).abs().max() > 1e-2  # a stale mask would show
        for first in (model, decoder):
            first(batch, attention_mask=mask, position_ids=positions)
            torch.testing.assert_close(decoder(other).last_hidden_state, expected, atol=0, rtol=0)
            torch.testing.assert_close(model(other).logits, model(other).logits)
            first(batch, attention_mask=mask, position_ids=positions)
            torch.testing.assert_close(model(other, logits_to_keep=1).logits[:, -1],
                                       model.lm_head(expected[:, -1]), atol=1e-6, rtol=1e-6)


def test_4d_masks_are_refused():
    model = memory_model()
    with pytest.raises(PlasticError, match="2D padding mask"):
        model(ids(6), attention_mask=window_attention_mask(6, 4))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("assign", [False, True])
def test_model_built_on_meta_matches_one_attached_normally(arch, assign):
    options = dict(layers=[0, 1], window=4, rank=4, conv_size=4, gate="input", decay=True,
                   memory_norm=True)
    reference = build_tiny(arch, **SIZES)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(reference.config)
    attach_memory(model, **options)
    assert all(p.is_meta for p in meta_parameters(model).values())
    if not assign:
        model.to_empty(device="cpu")
    missing, unexpected = model.load_state_dict(reference.state_dict(), strict=False, assign=assign)
    assert not unexpected and set(missing) == set(_theta_keys(model))  # only theta is new
    for name, buf in reference.named_buffers():  # RoPE's inv_freq is not in a state dict
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, buf.clone())
    torch.manual_seed(7)
    reset_theta(model)
    normal = build_tiny(arch, **SIZES)
    torch.manual_seed(7)
    attach_memory(normal, **options)
    theta, expected = meta_parameters(model), meta_parameters(normal)
    assert theta.keys() == expected.keys()
    for name, p in theta.items():
        assert p.device.type == "cpu" and p.dtype == torch.float32 and p.requires_grad, name
        torch.testing.assert_close(p, expected[name], atol=0, rtol=0, msg=name)
    assert torch.equal(theta["layers.0.lora_q.B"], torch.zeros_like(theta["layers.0.lora_q.B"]))
    assert (theta["layers.1.gate_logit"] == -16.0).all()
    x = ids(12)
    with torch.no_grad():
        windowed = reference(x, attention_mask=window_attention_mask(12, 4)).logits
        torch.testing.assert_close(model(x).logits, normal(x).logits, atol=0, rtol=0)
        torch.testing.assert_close(model(x).logits, windowed, atol=1e-6, rtol=1e-6)


def _theta_keys(model):
    """theta's names in the model's state dict."""
    return [f"model.layers.{k.split('.', 2)[1]}.self_attn.{k.split('.', 2)[2]}"
            for k in meta_parameters(model)]


def test_theta_on_meta_is_refused_by_load_theta(tmp_path):
    save_pretrained(memory_model(), tmp_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(build_tiny("llama", **SIZES).config)
    attach_memory(model, layers="all", window=4, rank=4, gate_init=0.0, conv_size=4)
    with pytest.raises(PlasticError, match="meta device"):
        load_theta(model, tmp_path)


@pytest.mark.parametrize("how", [dict(device_map="cpu"), dict(low_cpu_mem_usage=True)])
def test_loaded_with_device_map_or_low_memory(tmp_path, how):
    trained = memory_model("qwen3")
    save_pretrained(trained, tmp_path / "adapter")
    build_tiny("qwen3", **SIZES).save_pretrained(tmp_path / "base")
    model = from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base", **how),
                            tmp_path / "adapter")
    x = ids(12)
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, trained(x).logits, atol=1e-6, rtol=1e-6)
    assert_padding_free(model)


def _delta_inputs(b=2, h=3, t=40, d=16, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(b, h, t, d, generator=gen), dim=-1)
            for _ in range(2))
    v = torch.randn(b, h, t, d, generator=gen)
    beta = torch.rand(b, h, t, generator=gen).sigmoid()
    state = 0.1 * torch.randn(b, h, d, d, generator=gen)
    return [x.to(device, dtype) for x in (q, k, v, beta)] + [state.to(device)]


def test_dispatcher_keeps_the_torch_op_on_cpu(monkeypatch):
    def kernel(*a, **k):
        raise AssertionError("fla must not run on the CPU")
    monkeypatch.setattr(fla_bridge, "fla_chunk_delta_rule", lambda: kernel)
    monkeypatch.setattr(ops, "fla_chunk_delta_rule", lambda: kernel)
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v, beta, state = _delta_inputs(dtype=dtype)
        assert ops.chunkwise_backend(q) == "torch"
        out, final = delta_rule(q, k, v, beta, initial_state=state, chunk_size=16)
        ref_out, ref_final = delta_rule_chunkwise(q, k, v, beta, state, chunk_size=16)
        assert torch.equal(out, ref_out) and torch.equal(final, ref_final)


def test_fla_bridge_layout_with_a_stand_in_kernel(monkeypatch):
    """The [B,H,T,D] <-> [B,T,H,D] adaptation, checked with a torch stand-in for fla's kernel."""
    def stand_in(q, k, v, beta, scale, initial_state, output_final_state):
        assert scale == 1.0 and output_final_state and q.shape[1] > q.shape[2]  # [B,T,H,D]
        o, final = delta_rule_chunkwise(*(x.transpose(1, 2) for x in (q, k, v, beta)),
                                        initial_state, chunk_size=16)
        return o.transpose(1, 2), final
    monkeypatch.setattr(fla_bridge, "fla_chunk_delta_rule", lambda: stand_in)
    q, k, v, beta, state = _delta_inputs(t=40, dtype=torch.bfloat16)
    out, final = fla_bridge.delta_rule_fla(q, k, v, beta, state)
    ref_out, ref_final = delta_rule_chunkwise(q, k, v, beta, state, chunk_size=16)
    assert out.dtype == torch.bfloat16 and final.dtype == torch.float32
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(final, ref_final)


@pytest.mark.skipif(not torch.cuda.is_available() or fla_bridge.fla_chunk_delta_rule() is None,
                    reason="needs CUDA and flash-linear-attention (fla)")
@pytest.mark.parametrize("t", [40, 200])
def test_fla_matches_the_torch_chunkwise_op(t):
    q, k, v, beta, state = _delta_inputs(t=t, dtype=torch.bfloat16, device="cuda")
    assert ops.chunkwise_backend(q) == "fla"
    assert ops.chunkwise_backend(q.float()) == "torch"  # float32 stays on the torch op
    out, final = delta_rule(q, k, v, beta, initial_state=state)
    ref_out, ref_final = delta_rule_chunkwise(*(x.float() for x in (q, k, v, beta)), state)
    torch.testing.assert_close(out.float(), ref_out, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(final, ref_final, atol=3e-2, rtol=3e-2)
