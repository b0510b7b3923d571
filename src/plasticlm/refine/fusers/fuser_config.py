"""What a fuser is, as saved beside its weights (``fuser_config.json``): the shapes of the
two caches, the fuser kind (a member of ``FUSER_KINDS``), the layer map, the fusion mode and
what the transmitter shares; and reading such a saved config, old folders included."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, get_args

from plasticlm.config import Field, configclass, from_dict
from plasticlm.data.jsonl import read_json
from plasticlm.errors import PlasticError
from plasticlm.refine.cache import KVLayout
from plasticlm.refine.fusers.align import LayerMap, layer_map
from plasticlm.refine.fusers.fuser_layers import FUSER_KINDS

FusionMode = Literal["aligned", "prefix"]
FUSION_MODES = get_args(FusionMode)
Share = Literal["all", "draft"]
SHARE_MODES = get_args(Share)
FuserKind = Annotated[str, FUSER_KINDS.key]

CONFIG_NAME = "fuser_config.json"
WEIGHTS_NAME = "fuser.safetensors"
RETRAIN = "train the fuser again with `plasticlm refine train-fuser`"
# what a saved config without the key meant when it was written (folders written before
# there were kinds were low-rank; before fuse_last existed the last position was fused)
LEGACY_DEFAULTS = {"kind": "lowrank", "fuse_last": True}


@configclass
class FuserConfig:
    """Shapes of the two caches, the fuser kind and width, the layer map and the fusion mode."""

    receiver_layers: int = Field(gt=0, description="layers of the receiver's KV cache")
    receiver_kv_heads: int = Field(gt=0, description="KV heads per layer of the receiver")
    receiver_head_dim: int = Field(gt=0, description="head dim of the receiver's keys")
    transmitter_layers: int = Field(gt=0, description="layers of the transmitter's KV cache")
    transmitter_kv_heads: int = Field(gt=0, description="KV heads per layer of the transmitter")
    transmitter_head_dim: int = Field(gt=0, description="head dim of the transmitter's keys")
    kind: FuserKind = Field("c2c", description="the per-layer fuser module (FUSER_KINDS)")
    rank: int = Field(32, ge=1, description="lowrank: bottleneck width")
    hidden: int = Field(128, ge=1, description="c2c: hidden width of the K and V paths")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="c2c: dropout in the residual "
                           "blocks")
    layer_map: LayerMap = Field("last", description="which transmitter layer each receiver "
                                "layer reads: the last layers lined up, or by relative depth")
    mode: FusionMode = Field("aligned", description="aligned: added to the receiver's cache "
                             "at token-aligned positions; prefix: extra positions after BOS")
    receiver_name: str = Field("", description="the receiver model's name (for reports)")
    transmitter_name: str = Field("", description="the transmitter model's name")
    receiver_rope_scaling: float = Field(1.0, gt=0, description="the receiver's RoPE "
                                         "position scaling")
    transmitter_rope_scaling: float = Field(1.0, gt=0, description="the transmitter's RoPE "
                                            "position scaling")
    fuse_last: bool = Field(False, description="aligned mode: also fuse the last prompt "
                            "position and run the last token again on the fused cache (it "
                            "enters the cache twice); C2C leaves it unfused, an ablation")
    draft_tokens: int = Field(0, ge=0, description="prefix mode: the transmitter also decodes "
                              "this many greedy tokens after its prompt and shares their cache "
                              "too (small transmitters form the answer after their last layer)")
    share: Share = Field("all", description="prefix mode: which transmitter positions are "
                         "shared: the prompt's (after BOS) and the drafted tokens' (all), or "
                         "only the drafted tokens' (draft), so the prompt's cache never leaves")

    def __post_init__(self):
        if self.share == "draft" and (self.mode != "prefix" or self.draft_tokens < 1):
            raise PlasticError("share='draft' needs mode='prefix' and draft_tokens >= 1 (the "
                               "drafted tokens are what is shared)")

    @property
    def layers(self) -> list[int]:
        """Transmitter layer read by each receiver layer."""
        return layer_map(self.receiver_layers, self.transmitter_layers, self.layer_map)

    @classmethod
    def for_pair(cls, receiver: KVLayout, transmitter: KVLayout, **kw) -> FuserConfig:
        """The config of a fuser between caches shaped like ``receiver`` and ``transmitter``;
        ``kw`` (the other fields) refused in one line when wrong."""
        return from_dict(cls, {
            "receiver_layers": receiver.num_layers, "receiver_kv_heads": receiver.num_kv_heads,
            "receiver_head_dim": receiver.head_dim, "transmitter_layers": transmitter.num_layers,
            "transmitter_kv_heads": transmitter.num_kv_heads,
            "transmitter_head_dim": transmitter.head_dim,
            "receiver_rope_scaling": receiver.rope_scaling,
            "transmitter_rope_scaling": transmitter.rope_scaling, **kw})


def config_from(saved, source: str) -> FuserConfig:
    """The :class:`FuserConfig` of a saved (JSON) config, type-checked."""
    try:
        return from_dict(FuserConfig, saved)
    except (PlasticError, TypeError) as e:
        raise PlasticError(f"{source} is not a fuser config ({e})") from None


def read_fuser_config(folder: Path) -> FuserConfig:
    """The config saved in a fuser folder; keys a config written before they existed take
    what they meant then (``LEGACY_DEFAULTS``)."""
    saved = read_json(folder / CONFIG_NAME, "fuser config")
    if isinstance(saved, dict):
        saved = {**LEGACY_DEFAULTS, **saved}
    return config_from(saved, str(folder / CONFIG_NAME))
