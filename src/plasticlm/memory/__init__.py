"""FedNL's memory: delta-rule ops, memory-augmented windowed attention, O(1) streaming.

>>> model = attach_memory(build_tiny("llama"), layers="all", window=128, rank=8)  # doctest: +SKIP
>>> theta = meta_parameters(model)            # the only trainable parameters
>>> save_pretrained(model, "adapter/")        # safetensors + memory_config.json
"""

from plasticlm.memory.adapter import (
    attach_memory,
    detach_memory,
    from_pretrained,
    load_theta,
    memory_config,
    meta_parameters,
    reset_theta,
    save_pretrained,
    theta_bytes,
)
from plasticlm.memory.config import MemoryConfig
from plasticlm.memory.export import plain_peft_adapter, portable_peft_adapter, save_base_model
from plasticlm.memory.layer import MemoryAttention
from plasticlm.memory.masks import window_attention_mask
from plasticlm.memory.ops import delta_rule, delta_rule_chunkwise, delta_rule_recurrent
from plasticlm.memory.stream import MemoryStream

__all__ = [
    "MemoryAttention", "MemoryConfig", "MemoryStream", "attach_memory", "delta_rule",
    "delta_rule_chunkwise", "delta_rule_recurrent", "detach_memory", "from_pretrained",
    "load_theta", "memory_config", "meta_parameters", "plain_peft_adapter", "portable_peft_adapter",
    "reset_theta",
    "save_base_model", "save_pretrained", "theta_bytes", "window_attention_mask",
]
