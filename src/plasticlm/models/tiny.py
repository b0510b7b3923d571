"""Random-initialised small Llama, Qwen2 and Qwen3 models of chosen sizes."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from plasticlm.errors import PlasticError

ARCHS = ("llama", "qwen2", "qwen3")


def tiny_config(
    arch: str,
    vocab_size: int = 1024,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
    rope_theta: float = 10000.0,
    **extra,
):
    """A transformers config for ``arch`` in {llama, qwen2, qwen3} with the given sizes."""
    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
    if arch not in classes:
        raise PlasticError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHS)}")
    sizes = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                 num_heads=num_heads, num_kv_heads=num_kv_heads or num_heads,
                 head_dim=head_dim or 1, intermediate_size=intermediate_size or 1)
    bad = {k: v for k, v in sizes.items() if not (isinstance(v, int) and v >= 1)}
    if bad:
        raise PlasticError(f"model sizes must be whole numbers >= 1, not {bad}")
    if head_dim is None and hidden_size % num_heads:
        raise PlasticError(f"hidden_size={hidden_size} is not a multiple of num_heads={num_heads} "
                           "(or give head_dim)")
    num_kv_heads = num_kv_heads or num_heads
    if num_heads % num_kv_heads:
        raise PlasticError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    head_dim = head_dim or hidden_size // num_heads
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size or 3 * hidden_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        bos_token_id=extra.pop("bos_token_id", 1),
        eos_token_id=extra.pop("eos_token_id", 2),
        pad_token_id=extra.pop("pad_token_id", 0),
        **extra,
    )
    return classes[arch](**kwargs)


def build_tiny(arch: str, seed: int = 0, dtype: torch.dtype = torch.float32, **sizes):
    """A random-initialised causal LM of architecture ``arch`` (see :func:`tiny_config`).

    >>> m = build_tiny("qwen3", vocab_size=512, hidden_size=64, num_layers=2, num_heads=4)
    >>> m.config.model_type
    'qwen3'
    """
    config = tiny_config(arch, **sizes)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()
