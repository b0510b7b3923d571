"""Fusers: small per-layer maps from a transmitter's KV cache into a receiver's.

Two kinds of per-receiver-layer fuser read the mapped transmitter layer's K and V of a token
(RoPE undone) and add a projection to the receiver's own K and V:

- ``kind="c2c"`` (:class:`C2CLayerFuser`, the default, C2C's design): separate K and V
  paths, each reading concat(transmitter K (V), receiver K (V)) per token through a Linear to
  a hidden width, two residual pre-RMSNorm GELU blocks with dropout and a Linear to the
  receiver's width; a sigmoid weight per token and head from the hidden; one K and one V gate
  per layer, trained as Gumbel-sigmoid with an annealed temperature and hard 0/1 at inference
  (the layers whose gate stays on are the learned layer selection);
- ``kind="lowrank"`` (:class:`LowRankLayerFuser`): concat(K, V) through one rank-``r``
  bottleneck, a per-head weight that also sees the receiver's K/V, one soft gate per layer;
  far smaller, kept for the size comparison.

Improvements over C2C, both kinds: RoPE choice: transmitter keys are de-rotated at their own
positions, projected, and re-rotated with the receiver's RoPE at the receiver positions they
land on, so both fusion modes place keys exactly where they are used:

- ``aligned``: K_r += gate * w * rotate(K_proj, i), V_r += gate * w * V_proj at each
  receiver prompt position ``i`` (token-aligned to the transmitter by character offsets, so
  different tokenizers fuse); as in C2C every prompt token but the last is fused and the last
  runs unfused on the fused cache (``fuse_last`` fuses it too and runs it again, an ablation);
- ``prefix``: the projections enter the cache as extra positions 1..P after the receiver's
  BOS; the receiver's prompt then runs at positions P+1.. (explicit ``position_ids``).
"""


from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from plasticlm.config import to_dict
from plasticlm.errors import PlasticError
from plasticlm.refine.cache import KVCache, KVLayout, positions_from_mask
from plasticlm.refine.fusers.align import derotate, rotate
from plasticlm.refine.fusers.fuser_config import (
    CONFIG_NAME,
    RETRAIN,
    WEIGHTS_NAME,
    FuserConfig,
    read_fuser_config,
)
from plasticlm.refine.fusers.fuser_layers import FUSER_KINDS
from plasticlm.runtime import pick_device
from plasticlm.tensor_files import load_tensors


class Fuser(nn.Module):
    """The fuser set for one ordered (transmitter -> receiver) pair."""

    def __init__(self, config: FuserConfig, receiver_inv_freq: torch.Tensor,
                 transmitter_inv_freq: torch.Tensor):
        super().__init__()
        self.config = config
        kind = FUSER_KINDS[config.kind]
        self.layers = nn.ModuleList(kind.from_config(config) for _ in range(config.receiver_layers))
        self.register_buffer("receiver_inv_freq", receiver_inv_freq.float().clone())
        self.register_buffer("transmitter_inv_freq", transmitter_inv_freq.float().clone())

    @classmethod
    def for_pair(cls, receiver: KVLayout, transmitter: KVLayout, **kw) -> Fuser:
        """A fresh fuser for caches shaped like ``receiver`` and ``transmitter``."""
        return cls(FuserConfig.for_pair(receiver, transmitter, **kw), receiver.inv_freq,
                   transmitter.inv_freq)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def set_temperature(self, temperature: float) -> None:
        """The Gumbel-sigmoid temperature of every layer gate (training only; kinds with
        soft gates ignore it)."""
        for layer in self.layers:
            layer.temperature = float(temperature)

    def gates_on(self) -> dict[str, list[int]]:
        """The receiver layers whose K and V gates are on at inference (C2C: the learned
        layer selection; kinds with soft gates report every layer)."""
        on = [layer.gates_on() for layer in self.layers]
        return {"keys": [i for i, (k, _) in enumerate(on) if k],
                "values": [i for i, (_, v) in enumerate(on) if v]}

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
        return replace(receiver, keys=keys, values=values)

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
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_NAME).write_text(json.dumps(to_dict(self.config), indent=2) + "\n")
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | Path, device=None) -> Fuser:
        """Load a fuser written by :meth:`save_pretrained`, onto ``device`` (default: the
        run's, as models load: :func:`plasticlm.runtime.pick_device`). Sizes in the config that
        its weights do not back are refused before anything is built."""
        folder = Path(folder)
        if not (folder / CONFIG_NAME).is_file() or not (folder / WEIGHTS_NAME).is_file():
            raise PlasticError(f"{folder} is not a fuser folder (needs {CONFIG_NAME} and "
                               f"{WEIGHTS_NAME}); train one with `plasticlm refine train-fuser`")
        try:
            return cls.from_state(read_fuser_config(folder),
                                  load_tensors(folder / WEIGHTS_NAME, "fuser weights"),
                                  str(folder / WEIGHTS_NAME), device)
        except PlasticError as e:
            raise PlasticError(f"{e}; {RETRAIN}") from None

    @classmethod
    def from_state(cls, config: FuserConfig, state: dict[str, torch.Tensor], source: str,
                   device=None) -> Fuser:
        """A fuser of ``config`` holding ``state`` (its state dict, read from ``source``, a
        folder or a payload), on ``device`` (default: the run's)."""
        problem = _unbacked(config, state)
        if problem:
            raise PlasticError(f"{source} does not match its config ({problem})")
        try:
            config.layers   # noqa: B018 - the layer map must exist (sizes bounded by the file now)
        except PlasticError as e:
            raise PlasticError(f"{source}: {e}") from None
        for side, dim in (("receiver", config.receiver_head_dim),
                          ("transmitter", config.transmitter_head_dim)):
            freq = state.get(f"{side}_inv_freq")
            if freq is not None and tuple(freq.shape) != (dim // 2,):
                raise PlasticError(f"{source} does not match its config ({side} RoPE "
                                   f"frequencies {tuple(freq.shape)}, head dim {dim})")
        fuser = cls(config, state.get("receiver_inv_freq", torch.zeros(0)),
                    state.get("transmitter_inv_freq", torch.zeros(0)))
        try:
            fuser.load_state_dict(state)
        except RuntimeError as e:
            raise PlasticError(f"{source} does not match its config "
                               f"({str(e).splitlines()[0]})") from None
        return fuser.to(pick_device(device)).eval()


def _unbacked(config: FuserConfig, state: dict[str, torch.Tensor]) -> str | None:
    """Why ``state`` cannot be the weights of a fuser of ``config``, or None. Checked on the
    meta device once the layer count matches the file's, so a size no file backs (10^9
    layers or heads) is never allocated."""
    stored = {k.split(".")[1] for k in state if k.startswith("layers.")}
    if config.receiver_layers != len(stored):
        return f"{config.receiver_layers} receiver layers, weights for {len(stored)}"
    try:
        with torch.device("meta"):
            shapes = {k: tuple(v.shape) for k, v in
                      Fuser(config, torch.zeros(0), torch.zeros(0)).state_dict().items()
                      if not k.endswith("inv_freq")}
    except (RuntimeError, ValueError, TypeError, OverflowError) as e:   # sizes past int64
        return str(e).splitlines()[0]
    got = {k: tuple(v.shape) for k, v in state.items() if not k.endswith("inv_freq")}
    if shapes != got:
        wrong = sorted(k for k in set(shapes) | set(got) if shapes.get(k) != got.get(k))
        return f"{len(wrong)} tensors differ, e.g. {wrong[0]}: {shapes.get(wrong[0])} in the " \
               f"config, {got.get(wrong[0])} in the file"
    return None
