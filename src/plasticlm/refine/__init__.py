"""FedRefine: LLMs on different devices help each other answer by exchanging KV caches.

- ``cache``: typed per-layer KV caches, extracted from and injected into HF models;
- ``align``: layer maps, RoPE de-/re-rotation, token alignment across vocabularies;
- ``fuser``, ``fuser_config``, ``fuser_layers``: small per-layer fusers (aligned and prefix
  fusion; the kinds in ``FUSER_KINDS``), safetensors + config;
- ``peer``: a device's model and how prompts and answers become its tokens;
- ``train``: fuser training with both LLMs frozen;
- ``link``, ``fusion``, ``modes`` (``MODES``: alone, t2t, c2c, multi, co-c2c) and
  ``fedrefine``, each importing only the ones before it: the modes behind one API,
  :class:`FedRefine`;
- ``quant``, ``codec``, ``service``: caches on the wire (``QUANTS``) and network peers;
- ``rephrase`` and ``leakage``: privacy by rephrasing and its measured leakage;
- ``probe``: linear probes of what a transmitter's cache holds (the transfer probe gate);
- ``experiment``: the mode table (accuracy, time to first token, latency, bytes);
- ``transfer``: held-out transfer, each row beside its control transmitter.
"""

from plasticlm.refine.cache import KVCache, KVLayout, extract_cache, kv_layout
from plasticlm.refine.examples import Example
from plasticlm.refine.fedrefine import Answer, FedRefine, Scored
from plasticlm.refine.fusers.align import LAYER_MAPS, TokenAlignment, align_tokens, layer_map
from plasticlm.refine.fusers.fuser import Fuser
from plasticlm.refine.fusers.fuser_config import FUSION_MODES, FuserConfig
from plasticlm.refine.fusers.fuser_layers import FUSER_KINDS
from plasticlm.refine.fusers.train import FuserTrainConfig, train_fuser, train_fusers
from plasticlm.refine.leakage import (
    InversionResult,
    LeakageResult,
    learned_inversion,
    measure_leakage,
)
from plasticlm.refine.link import Link
from plasticlm.refine.modes import MODES, RefineConfig
from plasticlm.refine.peer import Peer
from plasticlm.refine.rephrase import rephrase, rule_rephrase
from plasticlm.refine.wire.quant import QUANTS

__all__ = [
    "FUSER_KINDS", "FUSION_MODES", "LAYER_MAPS", "MODES", "QUANTS", "Answer", "Example",
    "FedRefine", "Fuser", "FuserConfig", "FuserTrainConfig", "InversionResult", "KVCache", "KVLayout", "LeakageResult",
    "Link", "Peer", "RefineConfig", "Scored", "TokenAlignment", "align_tokens", "extract_cache",
    "kv_layout", "layer_map", "learned_inversion", "measure_leakage", "rephrase",
    "rule_rephrase", "train_fuser", "train_fusers",
]
