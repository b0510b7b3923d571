"""Real shapes: random-initialised models with the published configurations of the checkpoints
users bring (Qwen2.5, Qwen3, Llama 3.2), full padded vocabulary, layers optionally cut.

The fields below are copied from each checkpoint's published ``config.json``; nothing is
downloaded. A model built here has the real hidden size, heads, GQA ratio, head size, RoPE
settings, tied or untied embeddings and the full logits width (``vocab_size``), so shape and
memory bugs show on a CPU in seconds; only its weights are random and its depth can be cut.

Like the real checkpoints, the logits are wider than the tokenizer: ``config.vocab_size`` is
151,936 for Qwen (the tokenizer has about 151,665 entries) and 128,256 for Llama 3.2. The
tokenizer a shape is paired with here is smaller still, so any code that sizes something by
``len(tokenizer)`` where the logits width is meant fails at once.

>>> cfg = shape_config("qwen2.5-0.5b", num_layers=2, bos_token_id=1, eos_token_id=2)
>>> cfg.vocab_size, cfg.hidden_size, cfg.num_key_value_heads
(151936, 896, 2)
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from plasticlm.errors import PlasticError

# From the published config.json of each checkpoint (Hugging Face model pages).
SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
        max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
        sliding_window=32768, max_window_layers=24),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
        max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
        sliding_window=131072, max_window_layers=28),
    "qwen3-0.6b": dict(
        model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, hidden_act="silu", attention_bias=False,
        use_sliding_window=False, sliding_window=None, max_window_layers=28),
    "llama-3.2-1b": dict(
        model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
        max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, hidden_act="silu", attention_bias=False, mlp_bias=False,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0,
                      "low_freq_factor": 1.0, "original_max_position_embeddings": 8192}),
}
# The three shapes every method is tested on (tests/realshape).
TESTED_SHAPES = ("qwen2.5-0.5b", "qwen3-0.6b", "llama-3.2-1b")

_CLASSES = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}


def check_shape(name: str, num_layers: int | None = None) -> None:
    """Refuse an unknown shape or a depth it does not have, with the valid choices."""
    if name not in SHAPES:
        raise PlasticError(f"unknown model shape {name!r}; choose one of {', '.join(SHAPES)}")
    full = SHAPES[name]["num_hidden_layers"]
    if num_layers is not None and not (isinstance(num_layers, int) and 1 <= num_layers <= full):
        raise PlasticError(f"{name} has {full} layers: num_layers must be 1..{full}, "
                           f"not {num_layers!r}")


def shape_config(name: str, num_layers: int | None = None, bos_token_id: int | None = None,
                 eos_token_id: int | None = None, pad_token_id: int | None = None):
    """The transformers config of shape ``name``, its depth cut to ``num_layers`` (all when
    None). Special-token ids are those of the tokenizer it will be used with."""
    check_shape(name, num_layers)
    fields = dict(SHAPES[name])
    model_type = fields.pop("model_type")
    theta = fields.pop("rope_theta")
    scaling = fields.pop("rope_scaling", None) or {"rope_type": "default"}
    fields["rope_parameters"] = {**scaling, "rope_theta": theta}
    if num_layers is not None:
        fields["num_hidden_layers"] = num_layers
        if "max_window_layers" in fields:
            fields["max_window_layers"] = num_layers
    return _CLASSES[model_type](bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                                pad_token_id=pad_token_id, **fields)


def build_shape(name: str, num_layers: int | None = None, tokenizer=None, seed: int = 0,
                dtype: torch.dtype = torch.float32):
    """A random-initialised causal LM of shape ``name`` (see :func:`shape_config`), in eval
    mode. ``tokenizer`` gives the special-token ids; its length must not pass the logits
    width (it is smaller for every tokenizer this project pairs a shape with)."""
    ids = {}
    if tokenizer is not None:
        check_shape(name)
        if len(tokenizer) > SHAPES[name]["vocab_size"]:
            raise PlasticError(f"a tokenizer of {len(tokenizer)} entries does not fit {name}'s "
                               f"{SHAPES[name]['vocab_size']} logits")
        ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    config = shape_config(name, num_layers, **ids)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()
