"""Fusers: small per-layer maps from a transmitter's KV cache into a receiver's.

One :class:`LayerFuser` per receiver layer reads the mapped transmitter layer's K and V of a
token (RoPE undone), squeezes them through a rank-``r`` bottleneck and produces a K and a V
for every receiver kv head, a sigmoid weight per head (which also sees the receiver's own
K/V, so fusing several transmitters in sequence differs from fusing them in parallel) and
one sigmoid gate per layer. RoPE choice: transmitter keys are de-rotated at their own
positions, projected, and re-rotated with the receiver's RoPE at the receiver positions they
land on, so both fusion modes place keys exactly where they are used:

- ``aligned``: K_r += gate * w * rotate(K_proj, i), V_r += gate * w * V_proj at each
  receiver prompt position ``i`` (token-aligned to the transmitter); with ``fuse_last``
  the last prompt token is then run again at its own position on the fused cache;
- ``prefix``: the projections enter the cache as extra positions 1..P after the receiver's
  BOS; the receiver's prompt then runs at positions P+1.. (explicit ``position_ids``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from plasticlm.errors import PlasticError
from plasticlm.refine.align import derotate, layer_map, rotate
from plasticlm.refine.cache import KVCache, KVLayout, positions_from_mask

FUSION_MODES = ("aligned", "prefix")
SHARE_MODES = ("all", "draft")
CONFIG_NAME = "fuser_config.json"
WEIGHTS_NAME = "fuser.safetensors"


@dataclass
class FuserConfig:
    """Shapes of the two caches, the bottleneck rank, the layer map and the fusion mode."""

    receiver_layers: int
    receiver_kv_heads: int
    receiver_head_dim: int
    transmitter_layers: int
    transmitter_kv_heads: int
    transmitter_head_dim: int
    rank: int = 32
    layer_map: str = "last"
    mode: str = "aligned"
    receiver_name: str = ""
    transmitter_name: str = ""
    receiver_rope_scaling: float = 1.0
    transmitter_rope_scaling: float = 1.0
    # Aligned mode: also fuse the last prompt position and run the last token again on the
    # fused cache (at its own position). C2C leaves the last position unfused; with small
    # models the transmitter's answer sits mostly at that last position.
    fuse_last: bool = True
    # Prefix mode: the transmitter also decodes this many greedy tokens after its prompt and
    # shares their cache too (small transmitters form the answer after their last KV layer,
    # so the cache of the prompt alone may not hold it).
    draft_tokens: int = 0
    # Prefix mode: which transmitter positions are shared. "all": the prompt's (after BOS)
    # and the drafted tokens'; "draft": only the drafted tokens', so the prompt's cache
    # never leaves the transmitter and the fuser cannot key answers on the question.
    share: str = "all"

    def __post_init__(self):
        if self.mode not in FUSION_MODES:
            raise PlasticError(f"unknown fusion mode {self.mode!r}; choose one of "
                               f"{', '.join(FUSION_MODES)}")
        if self.rank < 1:
            raise PlasticError(f"fuser rank must be >= 1, not {self.rank}")
        if self.share not in SHARE_MODES:
            raise PlasticError(f"unknown share {self.share!r}; choose one of "
                               f"{', '.join(SHARE_MODES)}")
        if self.share == "draft" and (self.mode != "prefix" or self.draft_tokens < 1):
            raise PlasticError("share='draft' needs mode='prefix' and draft_tokens >= 1 (the "
                               "drafted tokens are what is shared)")

    @property
    def layers(self) -> list[int]:
        """Transmitter layer read by each receiver layer."""
        return layer_map(self.receiver_layers, self.transmitter_layers, self.layer_map)

    @classmethod
    def for_pair(cls, receiver: KVLayout, transmitter: KVLayout, **kw) -> FuserConfig:
        return cls(receiver.num_layers, receiver.num_kv_heads, receiver.head_dim,
                   transmitter.num_layers, transmitter.num_kv_heads, transmitter.head_dim,
                   receiver_rope_scaling=receiver.rope_scaling,
                   transmitter_rope_scaling=transmitter.rope_scaling, **kw)


class LayerFuser(nn.Module):
    """concat(K_t, V_t) per token -> rank-r code -> receiver K, V, per-head weight; one gate."""

    def __init__(self, in_width: int, heads: int, head_dim: int, rank: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        width = heads * head_dim
        self.norm = nn.RMSNorm(in_width)
        self.down = nn.Linear(in_width, rank, bias=False)
        self.up = nn.Linear(rank, 2 * width, bias=False)
        self.receiver_norm = nn.RMSNorm(2 * width)
        self.head_weight = nn.Linear(rank + 2 * width, heads)
        self.gate = nn.Parameter(torch.zeros(()))
        # Zero output map: an untrained fuser leaves the receiver's cache as it was.
        nn.init.zeros_(self.up.weight)

    def forward(self, t_keys: torch.Tensor, t_values: torch.Tensor,
                r_keys: torch.Tensor | None = None, r_values: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Transmitter K/V [B, Ht, T, Dt] (un-rotated), receiver K/V [B, Hr, T, Dr] or None
        -> weighted, gated K and V [B, Hr, T, Dr] (K un-rotated)."""
        b, _, t, _ = t_keys.shape
        x = torch.cat([t_keys, t_values], dim=1).permute(0, 2, 1, 3).reshape(b, t, -1)
        code = nn.functional.gelu(self.down(self.norm(x.float())))
        k, v = self.up(code).chunk(2, dim=-1)
        if r_keys is None:
            own = code.new_zeros(b, t, 2 * self.heads * self.head_dim)
        else:
            own = torch.cat([r_keys, r_values], dim=1).permute(0, 2, 1, 3).reshape(b, t, -1)
            own = self.receiver_norm(own.float())
        w = torch.sigmoid(self.head_weight(torch.cat([code, own], dim=-1)))      # [B, T, Hr]
        scale = (torch.sigmoid(self.gate) * w).transpose(1, 2)[..., None]        # [B, Hr, T, 1]

        def heads(z):
            return z.view(b, t, self.heads, self.head_dim).transpose(1, 2)

        return heads(k) * scale, heads(v) * scale


class Fuser(nn.Module):
    """The fuser set for one ordered (transmitter -> receiver) pair."""

    def __init__(self, config: FuserConfig, receiver_inv_freq: torch.Tensor,
                 transmitter_inv_freq: torch.Tensor):
        super().__init__()
        self.config = config
        in_width = 2 * config.transmitter_kv_heads * config.transmitter_head_dim
        self.layers = nn.ModuleList(
            LayerFuser(in_width, config.receiver_kv_heads, config.receiver_head_dim, config.rank)
            for _ in range(config.receiver_layers))
        self.register_buffer("receiver_inv_freq", receiver_inv_freq.float().clone())
        self.register_buffer("transmitter_inv_freq", transmitter_inv_freq.float().clone())

    @classmethod
    def for_pair(cls, receiver: KVLayout, transmitter: KVLayout, **kw) -> Fuser:
        """A fresh fuser for caches shaped like ``receiver`` and ``transmitter``."""
        return cls(FuserConfig.for_pair(receiver, transmitter, **kw), receiver.inv_freq,
                   transmitter.inv_freq)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def transmitter_layers_read(self) -> list[int]:
        """The transmitter layers that must travel (the others are never read)."""
        return sorted(set(self.config.layers))

    def check(self, receiver: KVLayout | None, transmitter: KVLayout) -> None:
        c = self.config
        want = (c.transmitter_layers, c.transmitter_kv_heads, c.transmitter_head_dim)
        got = (transmitter.num_layers, transmitter.num_kv_heads, transmitter.head_dim)
        if want != got:
            raise PlasticError(f"fuser expects a transmitter cache of (layers, kv heads, head "
                               f"dim) {want} but got {got}: use the fuser trained for this pair")
        if receiver is not None:
            want = (c.receiver_layers, c.receiver_kv_heads, c.receiver_head_dim)
            got = (receiver.num_layers, receiver.num_kv_heads, receiver.head_dim)
            if want != got:
                raise PlasticError(f"fuser expects a receiver cache of {want} but got {got}: "
                                   "use the fuser trained for this pair")

    def _transmitter_layer(self, cache: KVCache, layer: int, index: torch.Tensor | None):
        k = derotate(cache.keys[layer].float(), self.transmitter_inv_freq, cache.positions,
                     self.config.transmitter_rope_scaling)
        v = cache.values[layer].float()
        if index is not None:
            idx = index.clamp(max=cache.length - 1)[:, None, :, None]
            idx = idx.expand(-1, k.shape[1], -1, k.shape[-1]).to(k.device)
            k, v = k.gather(2, idx), v.gather(2, idx)
        return k, v

    def fuse_aligned(self, receiver: KVCache, transmitter: KVCache, index: torch.Tensor
                     ) -> KVCache:
        """Receiver cache (length T) with the transmitter's aligned K/V added residually;
        ``index`` [B, T] gives the transmitter position read at each receiver position."""
        self.check(receiver.layout, transmitter.layout)
        keys, values = [], []
        for l, f in enumerate(self.layers):
            tk, tv = self._transmitter_layer(transmitter, self.config.layers[l], index)
            rk = derotate(receiver.keys[l].float(), self.receiver_inv_freq, receiver.positions,
                          self.config.receiver_rope_scaling)
            dk, dv = f(tk, tv, rk, receiver.values[l].float())
            dk = rotate(dk, self.receiver_inv_freq, receiver.positions,
                        self.config.receiver_rope_scaling)
            keys.append(receiver.keys[l] + dk.to(receiver.dtype))
            values.append(receiver.values[l] + dv.to(receiver.dtype))
        return KVCache(receiver.layout, keys, values, receiver.token_ids, receiver.positions,
                       receiver.mask, receiver.model_name)

    def prefix(self, transmitter: KVCache, receiver_layout: KVLayout,
               start: torch.Tensor | int = 1, skip_first: bool = True,
               prompt_length: int | None = None) -> KVCache:
        """The transmitter cache projected into receiver K/V as extra positions starting at
        ``start`` (int or [B]); drops the transmitter's BOS position when ``skip_first``.
        With ``share="draft"`` only positions from ``prompt_length`` on (the drafted tokens;
        the last prompt position when nothing was drafted) are projected."""
        self.check(receiver_layout, transmitter.layout)
        first = 1 if skip_first and transmitter.length > 1 else 0
        if self.config.share == "draft":
            if prompt_length is None:
                raise PlasticError("a share='draft' fuser needs the transmitter's prompt_length")
            first = min(max(first, prompt_length), transmitter.length - 1)
        sl = slice(first, None)
        mask = transmitter.mask[:, sl]
        start_t = torch.as_tensor(start, device=mask.device).reshape(-1, 1)
        positions = positions_from_mask(mask) + start_t
        keys, values = [], []
        dtype = transmitter.dtype
        for l, f in enumerate(self.layers):
            tk, tv = self._transmitter_layer(transmitter, self.config.layers[l], None)
            dk, dv = f(tk[:, :, sl], tv[:, :, sl])
            keys.append(rotate(dk, self.receiver_inv_freq, positions,
                               self.config.receiver_rope_scaling).to(dtype))
            values.append(dv.to(dtype))
        return KVCache(receiver_layout, keys, values, transmitter.token_ids[:, sl], positions,
                       mask, f"prefix:{transmitter.model_name}")

    def save_pretrained(self, folder: str | Path) -> Path:
        """Write ``fuser_config.json`` and ``fuser.safetensors`` into ``folder``."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_NAME).write_text(json.dumps(asdict(self.config), indent=2) + "\n")
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> Fuser:
        """Load a fuser written by :meth:`save_pretrained`."""
        from safetensors.torch import load_file

        folder = Path(folder)
        if not (folder / CONFIG_NAME).is_file() or not (folder / WEIGHTS_NAME).is_file():
            raise PlasticError(f"{folder} is not a fuser folder (needs {CONFIG_NAME} and "
                               f"{WEIGHTS_NAME}); train one with `plasticlm refine train-fuser`")
        config = FuserConfig(**json.loads((folder / CONFIG_NAME).read_text()))
        state = load_file(str(folder / WEIGHTS_NAME))
        fuser = cls(config, state["receiver_inv_freq"], state["transmitter_inv_freq"])
        fuser.load_state_dict(state)
        return fuser.eval()


def stack_prefixes(prefixes: list[KVCache]) -> KVCache:
    """Concatenate prefix caches along positions (multi-transmitter prefix fusion)."""
    first = prefixes[0]
    return KVCache(first.layout,
                   [torch.cat([p.keys[l] for p in prefixes], 2) for l in range(first.num_layers)],
                   [torch.cat([p.values[l] for p in prefixes], 2)
                    for l in range(first.num_layers)],
                   torch.cat([p.token_ids for p in prefixes], 1),
                   torch.cat([p.positions for p in prefixes], 1),
                   torch.cat([p.mask for p in prefixes], 1), "+".join(p.model_name
                                                                      for p in prefixes))


def concat_caches(a: KVCache, b: KVCache) -> KVCache:
    """``a`` then ``b`` along positions (both already in the same model's space)."""
    return KVCache(a.layout, [torch.cat([x, y], 2) for x, y in zip(a.keys, b.keys)],
                   [torch.cat([x, y], 2) for x, y in zip(a.values, b.values)],
                   torch.cat([a.token_ids, b.token_ids], 1), torch.cat([a.positions, b.positions], 1),
                   torch.cat([a.mask, b.mask], 1), a.model_name)
