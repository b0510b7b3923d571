"""FedNL's memory: delta-rule ops, memory-augmented windowed attention, O(1) streaming.

>>> model = attach_memory(build_tiny("llama"), layers="all", window=128, rank=8)  # doctest: +SKIP
>>> theta = meta_parameters(model)            # the only trainable parameters
>>> save_pretrained(model, "adapter/")        # safetensors + memory_config.json

The names below load their module (and torch) on first use, so that a torch-free module of
the package (``mqar_config``, read by the command line's parser) imports without torch.
"""

import importlib

_MODULE_OF = {
    **dict.fromkeys(("attach_memory", "detach_memory", "from_pretrained", "load_theta",
                     "memory_config", "meta_parameters", "reset_theta", "save_pretrained",
                     "theta_bytes"), "adapter"),
    "MemoryAttention": "layer", "MemoryConfig": "layer",
    "window_attention_mask": "masks",
    **dict.fromkeys(("delta_rule", "delta_rule_chunkwise", "delta_rule_recurrent"), "ops"),
    "MemoryStream": "stream",
}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'plasticlm.memory' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"plasticlm.memory.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value
