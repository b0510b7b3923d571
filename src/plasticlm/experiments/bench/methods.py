"""The three methods against their peers: FedNL's state and bytes on the wire, FedRefine's
time to first token, SCoL's time per context."""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time

import torch
from transformers import DynamicCache

from plasticlm.data.squad import load_squad
from plasticlm.experiments.scol.setup import ExperimentConfig, quick_config, resolve_world_file
from plasticlm.experiments.scol.setup import load_model as load_scol_model
from plasticlm.fednl.config_sections import MemoryOptions, MethodConfig
from plasticlm.fednl.methods import prepare_model
from plasticlm.fednl.theta import get_theta
from plasticlm.memory import MemoryStream, attach_memory
from plasticlm.models import build_tiny, train_bpe_tokenizer
from plasticlm.refine import FedRefine, Fuser, Link, Peer
from plasticlm.refine.modes import RefineConfig
from plasticlm.refine.report import LINK_MB_PER_S, link_latency_ms
from plasticlm.scol.contexts import contexts_from_passages
from plasticlm.scol.meta import consolidate_stream


def _tiny(seed: int = 0):
    return build_tiny("qwen3", seed=seed, vocab_size=512, hidden_size=128, num_layers=4,
                      num_heads=4, num_kv_heads=2)


@torch.no_grad()
def state_rows(lengths: list[int], window: int = 256) -> list[dict]:
    """Bytes carried after T tokens: the memory stream vs a full KV cache (a tiny Qwen3)."""
    stream = MemoryStream(attach_memory(_tiny(), layers="all", window=window, rank=8),
                          chunk_tokens=256)
    base, cache = _tiny(), DynamicCache()
    ids = torch.randint(4, 512, (1, max(lengths)), generator=torch.Generator().manual_seed(0))
    rows, done = [], 0
    for t in sorted(lengths):
        chunk = ids[:, done:t]
        stream.feed(chunk, keep="last")
        out = base(input_ids=chunk, position_ids=torch.arange(done, t)[None], cache=cache,
                   use_cache=True)
        cache = getattr(out, "cache", None) or cache
        done = t
        kv = sum(x.numel() * x.element_size() for layer in cache.layers
                 for x in (layer.keys, layer.values))
        rows.append({"T": t, "stream_bytes": stream.state_bytes(), "kv_cache_bytes": kv,
                     "ratio": kv / stream.state_bytes()})
    return rows


def wire_rows() -> list[dict]:
    """Theta bytes per client and round (float32) of each method on the same tiny model."""
    def theta_bytes(name: str) -> int:
        method = MethodConfig(name=name, window=64)
        model = prepare_model(_tiny(), method, MemoryOptions())
        return sum(x.numel() * 4 for x in get_theta(model).values())

    fednl = theta_bytes("fednl")
    rows = [{"peer": "LoRA-FedAvg, same rank",
             "peer_bytes": theta_bytes("fedavg")},
            {"peer": "full FedAvg (every weight)",
             "peer_bytes": theta_bytes("fedavg-full")}]
    for r in rows:
        r.update(fednl_bytes=fednl, ratio=r["peer_bytes"] / fednl)
    return rows


REFINE_TEXTS = ["Q: Which organ does Ofloxin act on? A: the liver.",
                "Doctors prescribe Zutorex for migraines; it was approved in 1998.",
                "The river Arvel flows north through three provinces to the sea."] * 6


@torch.no_grad()
def refine_rows(prompts: int = 6, reps: int = 3) -> list[dict]:
    """FedRefine per answer: time to first token and bytes of alone, t2t and c2c, between a
    Qwen3 receiver (8 x 192) and a Llama transmitter (6 x 128) of the sandbox sizes; random
    weights (latency does not depend on them), t2t background of up to 12 tokens."""
    tok_r = train_bpe_tokenizer(REFINE_TEXTS, vocab_size=600)
    tok_t = train_bpe_tokenizer(REFINE_TEXTS, vocab_size=500)
    receiver = Peer("receiver", build_tiny(
        "qwen3", seed=1, vocab_size=len(tok_r), hidden_size=192, num_layers=8, num_heads=4,
        num_kv_heads=2, head_dim=48, intermediate_size=512).eval(), tok_r)
    transmitter = Peer("transmitter", build_tiny(
        "llama", seed=2, vocab_size=len(tok_t), hidden_size=128, num_layers=6, num_heads=4,
        num_kv_heads=2, head_dim=32, intermediate_size=352).eval(), tok_t)
    fuser = Fuser.for_pair(receiver.layout, transmitter.layout).eval()
    fr = FedRefine(receiver, [Link(transmitter, fuser)], RefineConfig(t2t_max_new_tokens=12))
    texts = [t.split(" A:")[0] + " A:" if " A:" in t else t for t in REFINE_TEXTS[:prompts]]
    rows = []
    for mode in ("alone", "t2t", "c2c"):
        ttft, wire, background = [], [], []
        for _ in range(reps):
            for text in texts:
                a = fr.ask(text, mode, max_new_tokens=1)
                ttft.append(a.ttft)
                wire.append(a.wire_bytes)
                background += [len(tok_t(b)["input_ids"]) for b in a.background]
        row = {"mode": mode, "ttft_ms": 1000 * statistics.median(ttft),
               "wire_bytes": statistics.mean(wire)}
        if background:
            row["background_tokens"] = statistics.mean(background)
        row["link_ms"] = {f"{s:g}": link_latency_ms(row["ttft_ms"], row["wire_bytes"], s)
                          for s in LINK_MB_PER_S}
        rows.append(row)
    return rows


def scol_rows(preset: str, contexts: int = 2, k: int = 4) -> list[dict]:
    """Wall seconds per context of SCoL (best of K candidates trained together, supervised
    reward) and of one sequential fine-tuning update of all layers, on the receiver of
    ``preset`` and passages of its world, with the default inner update."""
    cfg = quick_config() if preset == "quick" else ExperimentConfig()
    # explore (temperature 2), so K distinct candidates are trained
    scol = dataclasses.replace(cfg.scol, k=k, temperature=2.0)
    model, tok = load_scol_model(cfg)
    stream = contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")))[:contexts]
    rows = []
    for name, selection, together in (("sequential fine-tuning (all layers)", "all", False),
                                      (f"SCoL best of {k}", "best", True)):
        c = dataclasses.replace(scol, reward="supervised", together=together)
        t0 = time.perf_counter()
        _, records, _ = consolidate_stream(copy.deepcopy(model), tok, stream, c, selection)
        rows.append({"method": name, "seconds_per_context": (time.perf_counter() - t0)
                     / len(stream), "candidates": statistics.mean(len(r.candidates)
                                                                  for r in records)})
    return rows
