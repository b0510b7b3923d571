"""Typed per-layer KV caches: extract them from a causal LM, inject them back (transformers 5.x).

Works through ``DynamicCache`` only (no patched attention): Llama, Qwen2 and Qwen3 all keep
``cache.layers[i].keys/.values`` as [B, kv_heads, T, head_dim], with RoPE already applied
to the keys at the positions the tokens were run at.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from transformers import DynamicCache

from plasticlm.errors import PlasticError

BYTES_PER_ELEMENT_ON_WIRE = 2  # caches travel as bf16, as in the paper's 88 KB/token figure


def wire_bytes(layers: int, tokens: int, kv_heads: int, head_dim: int) -> int:
    """Bytes of the keys and values of ``tokens`` tokens in ``layers`` layers, in bf16."""
    return 2 * layers * tokens * kv_heads * head_dim * BYTES_PER_ELEMENT_ON_WIRE


@dataclass(frozen=True)
class KVLayout:
    """What a model's cache looks like: depth, kv heads, head dim, and its RoPE frequencies."""

    model_type: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    inv_freq: torch.Tensor = field(repr=False, compare=False)   # [head_dim // 2]
    rope_scaling: float = 1.0

    @property
    def width(self) -> int:
        """Features of one token's K (or V) in one layer: kv_heads * head_dim."""
        return self.num_kv_heads * self.head_dim


def kv_layout(model) -> KVLayout:
    """The :class:`KVLayout` of a Llama/Qwen2/Qwen3-style causal LM."""
    cfg = model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        raise PlasticError(f"model type {cfg.model_type!r} has no rotary embedding at "
                           "model.model.rotary_emb; FedRefine supports RoPE decoders such as "
                           "llama, qwen2 and qwen3")
    return KVLayout(cfg.model_type, cfg.num_hidden_layers,
                    getattr(cfg, "num_key_value_heads", None) or heads, head_dim,
                    rotary.inv_freq.detach().float().cpu().clone(),
                    float(getattr(rotary, "attention_scaling", 1.0)))


@dataclass
class KVCache:
    """Keys and values of every layer for one batch of token sequences.

    ``keys[l]``/``values[l]``: [B, kv_heads, T, head_dim]; keys carry RoPE at ``positions``
    [B, T]; ``token_ids`` [B, T] are the tokens they encode (in the owner's vocabulary);
    ``mask`` [B, T] is 1 on real tokens (0 on padding).
    """

    layout: KVLayout
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    token_ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    model_name: str = ""

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def num_kv_heads(self) -> int:
        return self.keys[0].shape[1]

    @property
    def head_dim(self) -> int:
        return self.keys[0].shape[-1]

    @property
    def length(self) -> int:
        # token_ids, not keys[0]: a received cache leaves the layers it was not sent empty
        return self.token_ids.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.keys[0].dtype

    def wire_bytes(self, layers: list[int] | None = None) -> int:
        """Bytes needed to send the real (unpadded) tokens of ``layers`` (default all) in bf16."""
        layers = range(self.num_layers) if layers is None else sorted(set(layers))
        return wire_bytes(len(layers), int(self.mask.sum()), self.num_kv_heads, self.head_dim)

    def delta(self, base: KVCache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer change (keys, values) from ``base`` to this cache (same shapes)."""
        return ([k - b for k, b in zip(self.keys, base.keys)],
                [v - b for v, b in zip(self.values, base.values)])

    def add_delta(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> KVCache:
        """This cache with ``keys[l]``/``values[l]`` [B, H, T, D] added to each layer."""
        return replace(self, keys=[k + d for k, d in zip(self.keys, keys)],
                       values=[v + d for v, d in zip(self.values, values)])

    def plus_changes(self, others: list[KVCache]) -> KVCache:
        """This cache plus every one of ``others``' change to it (parallel multi-transmitter
        fusion: each fuser writes on the receiver's own cache, their changes add up)."""
        changes = [o.delta(self) for o in others]
        return self.add_delta([sum(c[0][l] for c in changes) for l in range(self.num_layers)],
                              [sum(c[1][l] for c in changes) for l in range(self.num_layers)])

    def truncate(self, end: int) -> KVCache:
        """The first ``end`` positions."""
        return replace(self, keys=[k[:, :, :end] for k in self.keys],
                       values=[v[:, :, :end] for v in self.values],
                       token_ids=self.token_ids[:, :end], positions=self.positions[:, :end],
                       mask=self.mask[:, :end])

    def to(self, device) -> KVCache:
        """This cache on ``device`` (itself when already there)."""
        if self.token_ids.device == torch.device(device):
            return self
        return replace(self, keys=[k.to(device) for k in self.keys],
                       values=[v.to(device) for v in self.values],
                       token_ids=self.token_ids.to(device), positions=self.positions.to(device),
                       mask=self.mask.to(device))

    def drop_first(self, n: int) -> KVCache:
        """All but the first ``n`` positions (the rest keep their positions)."""
        return replace(self, keys=[k[:, :, n:] for k in self.keys],
                       values=[v[:, :, n:] for v in self.values],
                       token_ids=self.token_ids[:, n:], positions=self.positions[:, n:],
                       mask=self.mask[:, n:])

    def cat(self, other: KVCache) -> KVCache:
        """This cache then ``other`` along positions (both in this model's space)."""
        return KVCache.concat([self, other], self.model_name)

    @staticmethod
    def concat(caches: list[KVCache], model_name: str | None = None) -> KVCache:
        """Caches of one model's space joined along positions (e.g. several transmitters'
        prefixes); named ``a+b+..`` unless ``model_name`` is given."""
        first = caches[0]
        return KVCache(first.layout,
                       [torch.cat([c.keys[l] for c in caches], 2) for l in range(first.num_layers)],
                       [torch.cat([c.values[l] for c in caches], 2)
                        for l in range(first.num_layers)],
                       torch.cat([c.token_ids for c in caches], 1),
                       torch.cat([c.positions for c in caches], 1),
                       torch.cat([c.mask for c in caches], 1),
                       "+".join(c.model_name for c in caches) if model_name is None else model_name)

    def to_dynamic_cache(self):
        """A fresh ``DynamicCache`` holding these tensors (gradients flow through them)."""
        return build_dynamic_cache(self.keys, self.values)

    def rows(self, index: list[int]) -> KVCache:
        """The batch rows ``index`` (repeats allowed), in that order."""
        i = torch.tensor(index, dtype=torch.long)

        def take(x: torch.Tensor) -> torch.Tensor:
            return x[i.to(x.device)]
        return replace(self, keys=[take(k) for k in self.keys],
                       values=[take(v) for v in self.values], token_ids=take(self.token_ids),
                       positions=take(self.positions), mask=take(self.mask))

    def expand(self, n: int) -> KVCache:
        """The batch-1 cache repeated ``n`` times along the batch (for scoring choices)."""
        if self.keys[0].shape[0] != 1:
            raise PlasticError("expand() needs a batch-1 cache")
        return replace(self, keys=[k.expand(n, -1, -1, -1) for k in self.keys],
                       values=[v.expand(n, -1, -1, -1) for v in self.values],
                       token_ids=self.token_ids.expand(n, -1),
                       positions=self.positions.expand(n, -1), mask=self.mask.expand(n, -1))


def stack_caches(caches: list[KVCache]) -> KVCache:
    """Batch-1 caches of one model stacked into one batch, left-padded to the longest (padding
    is masked out; each row keeps its own positions)."""
    if any(c.keys[0].shape[0] != 1 for c in caches):
        raise PlasticError("stack_caches() needs batch-1 caches")
    width = max(c.length for c in caches)

    def pad(x: torch.Tensor, dim: int) -> torch.Tensor:
        missing = width - x.shape[dim]
        if missing == 0:
            return x
        shape = list(x.shape)
        shape[dim] = missing
        return torch.cat([x.new_zeros(shape), x], dim=dim)

    first = caches[0]
    return KVCache(first.layout,
                   [torch.cat([pad(c.keys[l], 2) for c in caches]) for l in range(first.num_layers)],
                   [torch.cat([pad(c.values[l], 2) for c in caches])
                    for l in range(first.num_layers)],
                   torch.cat([pad(c.token_ids, 1) for c in caches]),
                   torch.cat([pad(c.positions, 1) for c in caches]),
                   torch.cat([pad(c.mask, 1) for c in caches]), first.model_name)


def build_dynamic_cache(keys: list[torch.Tensor], values: list[torch.Tensor]):
    """A ``DynamicCache`` whose layer ``l`` holds ``keys[l]``/``values[l]`` [B, H, T, D]."""
    cache = DynamicCache()
    for layer, (k, v) in enumerate(zip(keys, values)):
        cache.update(k, v, layer)
    return cache


def positions_from_mask(mask: torch.Tensor, start: int | torch.Tensor = 0) -> torch.Tensor:
    """Position ids [B, T] that count only real tokens (left padding gets position 0)."""
    return ((mask.cumsum(-1) - 1).clamp(min=0) + start).long()


@torch.no_grad()
def extract_cache(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                  model_name: str = "") -> tuple[KVCache, torch.Tensor]:
    """Run ``model`` on ``input_ids`` [B, T] and return ``(KVCache, logits [B, T, V])``."""
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise PlasticError(f"input_ids must be [batch, tokens] with tokens > 0, got "
                           f"{tuple(input_ids.shape)}")

    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
    positions = positions_from_mask(mask)
    cache = DynamicCache()
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=cache,
                use_cache=True)
    cache = out.cache if getattr(out, "cache", None) is not None else cache
    keys = [layer.keys for layer in cache.layers]
    values = [layer.values for layer in cache.layers]
    return KVCache(kv_layout(model), keys, values, input_ids, positions, mask, model_name), \
        out.logits


def continue_from_cache(model, cache: KVCache, input_ids: torch.Tensor,
                        attention_mask: torch.Tensor | None = None, keys=None, values=None,
                        start_positions: torch.Tensor | None = None):
    """Run ``input_ids`` [B, N] after ``cache`` (or after explicit per-layer ``keys``/``values``,
    e.g. fused ones, of the same length); returns logits [B, N, V].

    Positions continue from the last real cached position unless ``start_positions`` [B]
    says otherwise (prefix fusion runs the prompt after the prefix's positions).
    """
    device = next(model.parameters()).device
    keys = cache.keys if keys is None else keys
    values = cache.values if values is None else values
    input_ids = input_ids.to(device)
    new_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
    full_mask = torch.cat([cache.mask.to(device), new_mask], dim=1)
    if start_positions is None:
        start_positions = cache.mask.sum(-1).to(device)
    positions = start_positions[:, None] + (new_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=full_mask, position_ids=positions.long(),
                cache=build_dynamic_cache(keys, values), use_cache=True)
    return out.logits
