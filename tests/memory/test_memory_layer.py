"""Memory-augmented attention on tiny Llama / Qwen2 / Qwen3: equivalences, theta, save/load."""

import dataclasses
import json

import pytest
import torch

from plasticlm.config import from_dict
from plasticlm.errors import PlasticError
from plasticlm.memory import (
    MemoryConfig,
    attach_memory,
    detach_memory,
    from_pretrained,
    meta_parameters,
    save_pretrained,
    theta_bytes,
    window_attention_mask,
)
from plasticlm.models import build_tiny

SIZES = dict(vocab_size=96, hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
             max_position_embeddings=256)
ARCHS = ["llama", "qwen2", "qwen3"]


def tiny(arch, seed=0):
    return build_tiny(arch, seed=seed, **SIZES)


def ids(t=40, b=2, seed=0):
    return torch.randint(0, SIZES["vocab_size"], (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ARCHS)
def test_fresh_memory_equals_windowed_base(arch):
    x = ids()
    base = tiny(arch)
    with torch.no_grad():
        windowed = base(x, attention_mask=window_attention_mask(x.shape[1], 8)).logits
        full = base(x).logits
    model = attach_memory(tiny(arch), layers=[0, 2], window=8, rank=4, conv_size=4)
    with torch.no_grad():
        out = model(x).logits
    torch.testing.assert_close(out, windowed, atol=1e-5, rtol=1e-5)
    assert (out - full).abs().max() > 1e-2  # the window is real: it changes the logits


@pytest.mark.parametrize(("mix", "norm"), [("additive", False), ("convex", True),
                                           ("additive", True)])
def test_mix_and_norm_options(mix, norm):
    """Closed gate: every mix is the windowed base. Open gate with memory_norm: each head's
    read has unit RMS and its scale is part of theta."""
    x = ids()
    base = tiny("qwen3")
    with torch.no_grad():
        windowed = base(x, attention_mask=window_attention_mask(x.shape[1], 8)).logits
    closed = attach_memory(tiny("qwen3"), layers=[1], window=8, rank=4, mix=mix, memory_norm=norm)
    with torch.no_grad():
        torch.testing.assert_close(closed(x).logits, windowed, atol=1e-5, rtol=1e-5)
    model = attach_memory(tiny("qwen3"), layers=[1], window=8, rank=4, mix=mix,
                          memory_norm=norm, gate_init=0.0)
    attn = model.get_decoder().layers[1].self_attn
    assert ("layers.1.memory_norm.weight" in meta_parameters(model)) == norm
    reads = []
    real_branch = attn._memory_branch
    attn._memory_branch = lambda *a: reads.append(real_branch(*a)) or reads[-1]
    with torch.no_grad():
        model(x)
    if norm:
        # after the first tokens, whose near-empty reads are dominated by the epsilon
        rms = attn.memory_norm(reads[0][:, :, 4:].float()).pow(2).mean(-1).sqrt()
        torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-3, rtol=1e-3)
    with pytest.raises(PlasticError, match="config mix: input should be 'convex' or 'additive'"):
        from_dict(MemoryConfig, {"mix": "sum"})


def _open_memory(seed=0, **options):
    """A qwen3 memory model with an open gate and non-zero LoRA in layer 1."""
    torch.manual_seed(seed)  # theta's initialisation draws from the global generator
    model = attach_memory(tiny("qwen3"), layers=[1], window=8, rank=4, gate_init=0.0, **options)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in meta_parameters(model).items():
            if ".B" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def test_decay_limits_are_the_plain_and_the_memoryless_rule():
    """exp(g) -> 1 is the plain delta rule; exp(g) -> 0 forgets everything before each write,
    which is the memory with its recurrence removed; in between it is neither."""
    x = ids()
    outs = {}
    for name, options in {"plain": {}, "none": dict(recurrent=False),
                          "keep": dict(decay=True, decay_init=40.0),
                          "forget": dict(decay=True, decay_init=-40.0),
                          "half": dict(decay=True, decay_init=0.0)}.items():
        model = _open_memory(**options)
        if "decay" in options:
            assert "layers.1.decay_proj.bias" in meta_parameters(model)
        with torch.no_grad():
            outs[name] = model(x).logits
    torch.testing.assert_close(outs["keep"], outs["plain"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs["forget"], outs["none"], atol=1e-5, rtol=1e-5)
    assert (outs["half"] - outs["plain"]).abs().max() > 1e-3
    assert (outs["half"] - outs["none"]).abs().max() > 1e-3


def test_input_gate_starts_as_the_head_gate_and_learns_per_token():
    x = ids()
    head, gated = _open_memory(), _open_memory(gate="input")
    with torch.no_grad():
        torch.testing.assert_close(gated(x).logits, head(x).logits, atol=1e-6, rtol=1e-6)
    attn = gated.get_decoder().layers[1].self_attn
    gated(x).logits.square().mean().backward()
    grad = attn.gate_proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    with torch.no_grad():
        attn.gate_proj.weight.normal_(std=1.0)
        alpha = attn._alpha_of(torch.randn(2, 5, SIZES["hidden_size"]))
    assert alpha.shape == (2, SIZES["num_heads"], 5, 1)
    assert alpha.std() > 0.05 and bool(((alpha > 0) & (alpha < 1)).all())


def test_shared_lora_changes_the_attention_memory_lora_does_not():
    """With the gate closed, a memory-only LoRA leaves the windowed base untouched; a shared
    LoRA changes the q/k/v the attention reads as well."""
    x = ids()
    base = tiny("qwen3")
    with torch.no_grad():
        windowed = base(x, attention_mask=window_attention_mask(x.shape[1], 8)).logits
    outs = {}
    for scope in ("memory", "shared"):
        model = _open_memory(lora_scope=scope)
        with torch.no_grad():
            model.get_decoder().layers[1].self_attn.gate_logit.fill_(-40.0)
            outs[scope] = model(x).logits
    torch.testing.assert_close(outs["memory"], windowed, atol=1e-5, rtol=1e-5)
    assert (outs["shared"] - windowed).abs().max() > 1e-3
    with pytest.raises(PlasticError, match="lora_scope: input should be 'memory' or 'shared'"):
        attach_memory(tiny("qwen3"), layers=[1], lora_scope="everywhere")


@pytest.mark.parametrize("arch", ARCHS)
def test_window_covering_sequence_equals_base(arch):
    x = ids(t=30)
    with torch.no_grad():
        full = tiny(arch)(x).logits
        out = attach_memory(tiny(arch), window=30, rank=4)(x).logits
    torch.testing.assert_close(out, full, atol=1e-5, rtol=1e-5)


def test_gate_opened_changes_output_and_alpha_in_unit_interval():
    model = attach_memory(tiny("qwen3"), layers=[1], window=8, rank=4)
    attn = model.get_decoder().layers[1].self_attn
    assert 0 < attn.alpha.min() and attn.alpha.max() < 1e-6
    x = ids()
    with torch.no_grad():
        before = model(x).logits
        attn.gate_logit.fill_(0.0)
        after = model(x).logits
    assert (after - before).abs().max() > 1e-3


def test_meta_parameters_are_exactly_theta():
    model = attach_memory(tiny("qwen2"), layers=[0, 2], window=8, rank=4, conv_size=3)
    theta = meta_parameters(model)
    per_layer = ["lora_q.A", "lora_q.B", "lora_k.A", "lora_k.B", "lora_v.A", "lora_v.B",
                 "beta_proj.weight", "beta_proj.bias", "gate_logit", "conv.weight"]
    assert set(theta) == {f"layers.{i}.{n}" for i in (0, 2) for n in per_layer}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == {id(p) for p in theta.values()}
    h, kv, d, r = 4, 2, 16, 4
    assert theta["layers.0.lora_q.B"].shape == (h * d, r)
    assert theta["layers.0.lora_k.B"].shape == (kv * d, r)
    assert theta["layers.0.gate_logit"].shape == (h,)
    assert theta_bytes(model) == 4 * sum(p.numel() for p in theta.values())


def test_gradients_reach_theta_only_and_flow_through_memory():
    model = attach_memory(tiny("llama"), layers=[1], window=4, rank=4, gate_init=0.0)
    x = ids(t=80, b=1)  # > chunk (64): the chunkwise path is differentiated
    out = model(x, labels=x)
    out.loss.backward()
    theta = meta_parameters(model)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in theta.values())
    assert theta["layers.1.lora_k.A"].grad.abs().sum() == 0  # B = 0 at init: A gets no gradient yet
    assert theta["layers.1.lora_k.B"].grad.abs().sum() > 0
    assert theta["layers.1.beta_proj.weight"].grad.abs().sum() > 0
    assert all(p.grad is None for n, p in model.named_parameters() if id(p) not in {id(t) for t in theta.values()})


def test_save_and_load_round_trip(tmp_path):
    model = attach_memory(tiny("qwen3"), layers=[0, 1], window=8, rank=4, conv_size=4, gate_init=-2.0)
    with torch.no_grad():
        for p in meta_parameters(model).values():
            p.add_(torch.randn_like(p) * 0.1)
    x = ids()
    with torch.no_grad():
        expected = model(x).logits
    nbytes = save_pretrained(model, tmp_path / "adapter")
    assert nbytes == theta_bytes(model)
    assert (tmp_path / "adapter" / "memory_config.json").exists()
    assert (tmp_path / "adapter" / "memory_theta.safetensors").stat().st_size >= nbytes
    loaded = from_pretrained(tiny("qwen3"), tmp_path / "adapter")
    assert loaded.memory_config == model.memory_config
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, expected)
    with pytest.raises(PlasticError, match="built for 'qwen3'"):
        from_pretrained(tiny("llama"), tmp_path / "adapter")
    # an adapter saved before memory_norm, gate, decay and lora_scope existed loads as before
    path = tmp_path / "adapter" / "memory_config.json"
    old = {k: v for k, v in json.loads(path.read_text()).items()
           if k not in ("memory_norm", "gate", "decay", "decay_init", "lora_scope")}
    path.write_text(json.dumps(old))
    again = from_pretrained(tiny("qwen3"), tmp_path / "adapter")
    assert again.memory_config == model.memory_config and again.memory_config.layers == (0, 1)
    with torch.no_grad():
        torch.testing.assert_close(again(x).logits, expected)
    path.write_text(json.dumps({**old, "mix": "convx"}))
    with pytest.raises(PlasticError, match="mix: input should be 'convex' or 'additive'"):
        from_pretrained(tiny("qwen3"), tmp_path / "adapter")


def test_detach_restores_base_and_errors_are_clear():
    x = ids()
    with torch.no_grad():
        base_logits = tiny("llama")(x).logits
        model = detach_memory(attach_memory(tiny("llama"), window=4))
        torch.testing.assert_close(model(x).logits, base_logits)
    with pytest.raises(PlasticError, match="already has memory"):
        attach_memory(attach_memory(tiny("llama"), window=4), window=4)
    with pytest.raises(PlasticError, match="do not exist"):
        attach_memory(tiny("llama"), layers=[7], window=4)
    with pytest.raises(PlasticError, match="unknown memory option"):
        attach_memory(tiny("llama"), window=4, ranks=3)
    with pytest.raises(PlasticError, match="no memory attached"):
        meta_parameters(tiny("llama"))


def test_other_architectures_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=32))
    with pytest.raises(PlasticError, match="'gpt2'"):
        attach_memory(gpt2, window=4)


def test_incremental_hf_cache_is_refused():
    model = attach_memory(tiny("qwen2"), window=8)
    with torch.no_grad():
        out = model(ids(t=10), use_cache=True)
        with pytest.raises(PlasticError, match="MemoryStream"):
            model(ids(t=1), cache=out.cache, use_cache=True)


@pytest.mark.parametrize("conv", [0, 4])
def test_padding_mask_is_respected(conv):
    """Left padding with an open gate and real (nonzero) pad tokens: the padded row's real
    tokens give the unpadded row's logits, so padding neither writes the memory nor enters
    the convolution; without the padding mask they differ."""
    model = attach_memory(tiny("llama"), layers="all", window=6, gate_init=0.0, conv_size=conv)
    with torch.no_grad():  # a trained-looking theta: LoRA B and conv away from their init
        for name, p in model.named_parameters():
            if p.requires_grad and ("lora" in name or "conv" in name):
                p.add_(0.3 * torch.randn_like(p))
    x = ids(t=12, b=1)
    padded = torch.cat([torch.full((1, 3), 7, dtype=torch.long), x], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 12, dtype=torch.long)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        plain = model(x).logits
        out = model(padded, attention_mask=mask, position_ids=positions).logits[:, 3:]
        unmasked = model(padded, attention_mask=torch.ones_like(mask),
                         position_ids=positions).logits[:, 3:]
    torch.testing.assert_close(out, plain, atol=1e-5, rtol=1e-5)
    assert (unmasked - plain).abs().max() > 1e-3


def test_config_dataclass_defaults():
    cfg = MemoryConfig()
    assert cfg.gate_init <= -12 and cfg.conv_size == 0 and cfg.layers == ()


def test_mqar_batch_follows_the_protocol():
    from plasticlm.experiments.memory.mqar import IGNORE, mqar_batch

    ids, labels = mqar_batch(4, 40, 6, 64, torch.Generator().manual_seed(0))
    for row, lab in zip(ids, labels):
        keys, values = row[0:12:2], row[1:12:2]
        assert ((1 <= keys) & (keys < 32)).all() and ((32 <= values) & (values < 64)).all()
        assert len(set(keys.tolist())) == 6 and len(set(values.tolist())) == 6
        where = (lab != IGNORE).nonzero().flatten()
        assert len(where) == 6 and (where >= 12).all()
        pairs = dict(zip(keys.tolist(), values.tolist()))
        for p in where.tolist():  # a re-queried key, labelled with its value, which follows it
            assert pairs[row[p].item()] == lab[p].item() == row[p + 1].item()


def test_mqar_memory_recalls_what_the_window_cannot():
    """With the key-value pairs beyond a 4-token window, the window alone and the memory with
    its recurrence removed stay at chance (1/16 values) while the memory recalls well above
    it; learning the value range alone would not pass."""
    from plasticlm.experiments.memory.mqar import train_mqar
    from plasticlm.experiments.memory.mqar_config import MQARConfig

    cfg = MQARConfig(steps=200, batch=16, seq_len=32, num_kv=4, vocab=32, hidden=32, heads=2,
                     window=4, eval_every=200, test_examples=256)
    memory = train_mqar(cfg, with_memory=True, progress=False)["test_accuracy"]
    window = train_mqar(cfg, with_memory=False, progress=False)["test_accuracy"]
    no_recurrence = train_mqar(dataclasses.replace(cfg, recurrent=False), with_memory=True,
                               progress=False)["test_accuracy"]
    assert set(memory) == {"seq32_kv4", "seq64_kv8", "seq128_kv4"}
    assert window["seq32_kv4"] < 0.1 and no_recurrence["seq32_kv4"] < 0.1
    assert memory["seq32_kv4"] > max(window["seq32_kv4"], no_recurrence["seq32_kv4"]) + 0.1
