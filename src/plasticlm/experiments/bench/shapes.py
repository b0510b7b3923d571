"""``plasticlm bench --shape NAME``: each method's cost at a real shape beside its baseline's,
for the same shape and batch in one run: step time and peak memory, and their ratios.

- FedNL: one local training step with the memory (theta = memory LoRA, beta, gate) against
  one LoRA-FedAvg step at the same rank and window;
- FedRefine: c2c (transmitter prefill, fusion, receiver prefill) against text-to-text
  (the transmitter writes background, the receiver reads it), one transmitter each, to the
  first token, with the receiver alone beside them; and the bytes a transmitted token costs
  on the wire in each cache quantisation (the codec's payload, measured at the bench's depth
  and scaled to the shape's full depth) beside the paper's 88 KB;
- SCoL: one context consolidated as the best of K candidates against one sequential
  fine-tuning update of every layer.

Models are random-initialised at the published shape (``shape:NAME@LAYERS``, the sandbox's
small tokenizer; costs do not depend on the weights). Peak memory is CUDA's peak allocation
on a GPU and, on a CPU, the process's resident set above where it stood before the step
(sampled every 5 ms, freed memory handed back to the OS first).
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import gc
import threading
import time
import traceback
from collections.abc import Callable

import psutil
import torch

from plasticlm.config import load_config
from plasticlm.data.context_tasks import load_openbook
from plasticlm.data.squad import load_squad
from plasticlm.eval.prompts import context_prompt
from plasticlm.experiments.scol.setup import quick_config, resolve_world_file
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.local_round import local_update
from plasticlm.fednl.methods import prepare_model
from plasticlm.fednl.task import OpenBookTask
from plasticlm.fednl.theta import get_theta
from plasticlm.models import load_causal_lm
from plasticlm.models.shapes import SHAPES
from plasticlm.models.specs import resolve_model
from plasticlm.refine import FedRefine, Fuser, Link, Peer
from plasticlm.refine.modes import RefineConfig
from plasticlm.refine.report import PAPER
from plasticlm.refine.wire.codec import encode_bundle
from plasticlm.refine.wire.quant import QUANTS
from plasticlm.runtime import machine
from plasticlm.scol.contexts import contexts_from_passages
from plasticlm.scol.meta import consolidate_stream


def release_freed_memory() -> None:
    """Hand freed memory back to the OS (glibc), so that a CPU step's peak RSS rise is its
    own: otherwise the allocator keeps an earlier step's pages and the next rise reads 0.
    Large blocks are kept on mmap (a fixed threshold), which frees them at once."""
    gc.collect()
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: RSS rises are then lower bounds
        return
    libc.mallopt(-3, 1 << 20)   # M_MMAP_THRESHOLD: 1 MiB, no longer raised by frees
    libc.malloc_trim(0)


def measure(fn: Callable[[], object], device: torch.device) -> tuple[object, float, float]:
    """(result, seconds, peak MB): CUDA's peak allocation, or the CPU process's peak RSS
    above its level before ``fn``."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize(device)
        return out, time.perf_counter() - t0, torch.cuda.max_memory_allocated(device) / 1e6
    release_freed_memory()
    proc = psutil.Process()
    base = peak = proc.memory_info().rss
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.wait(0.005):
            peak = max(peak, proc.memory_info().rss)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    try:
        out = fn()
    finally:
        seconds = time.perf_counter() - t0
        done.set()
        watcher.join()
    return out, seconds, (max(peak, proc.memory_info().rss) - base) / 1e6


def _row(comparison: str, ours: str, peer: str, a: tuple, b: tuple) -> dict:
    return {"comparison": comparison, "ours": ours, "peer": peer,
            "ours_s": a[1], "peer_s": b[1], "ours_mb": a[2], "peer_mb": b[2],
            "time_ratio": a[1] / b[1], "memory_ratio": a[2] / b[2] if b[2] > 0 else None}


def fednl_row(folder: str, batch: int, dtype: str, device: torch.device) -> dict:
    """One local step of FedNL against one of LoRA-FedAvg, same rank, window and batch."""
    world = resolve_world_file(quick_config(), "squad").parents[1]
    items = load_openbook(world / "openbook" / "items.jsonl")[: 4 * batch]
    task = OpenBookTask("bench", "bench", items, items[:2])
    results = []
    for name in ("fednl", "fedavg"):
        cfg = load_config(FedNLConfig, None, [f"method.name={name}", "train.local_steps=1",
                                              f"train.batch_size={batch}", "method.lora_rank=8",
                                              "method.window=64"])
        model, tok = load_causal_lm(folder, dtype=dtype, device=device)
        torch.manual_seed(0)
        model = prepare_model(model, cfg.method, cfg.memory)
        start = get_theta(model)
        local_update(model, tok, task, start, {}, cfg, seed=0)  # warm-up
        results.append(measure(lambda m=model, c=cfg, t=tok, s=start: local_update(
            m, t, task, s, {}, c, seed=1), device))
        del model
    return _row("FedNL train step vs LoRA-FedAvg step (rank 8, window 64, batch "
                f"{batch})", "fednl", "fedavg LoRA", results[0], results[1])


@torch.no_grad()
def refine_row(folder: str, dtype: str, device: torch.device, prompts: int = 4,
               full_layers: int | None = None) -> dict:
    """c2c against t2t (one transmitter each) to the first answer token, the receiver alone
    beside them, and bytes per transmitted token; the transmitter has the receiver's shape."""
    rmodel, tok = load_causal_lm(folder, dtype=dtype, device=device)
    tmodel = copy.deepcopy(rmodel)
    receiver, transmitter = Peer("receiver", rmodel, tok), Peer("transmitter", tmodel, tok)
    fuser = Fuser.for_pair(receiver.layout, transmitter.layout).to(device).eval()
    fr = FedRefine(receiver, [Link(transmitter, fuser)], RefineConfig(t2t_max_new_tokens=12))
    world = resolve_world_file(quick_config(), "squad").parents[1]
    texts = [context_prompt(it.context, it.question)
             for it in load_openbook(world / "openbook" / "items.jsonl")[:prompts]]
    out = {}
    for mode in ("alone", "c2c", "t2t"):
        fr.ask(texts[0], mode, max_new_tokens=1)  # warm-up
        out[mode] = measure(lambda m=mode: [fr.ask(t, m, max_new_tokens=1) for t in texts],
                            device)
    row = _row(f"FedRefine c2c vs t2t, one transmitter each, to the first token ({prompts} "
               "prompts)", "c2c", "t2t", out["c2c"], out["t2t"])
    row.update(alone_s=out["alone"][1], c2c_over_alone=out["c2c"][1] / out["alone"][1],
               t2t_over_alone=out["t2t"][1] / out["alone"][1],
               wire=wire_per_token(transmitter, " ".join(texts), full_layers))
    return row


def wire_per_token(transmitter: Peer, text: str, full_layers: int | None = None) -> dict:
    """Bytes per transmitted token of ``text``'s cache (every layer) as the codec sends it, per
    quantisation: measured at the model's depth and, per layer, scaled to ``full_layers``."""
    sent = transmitter.prefill(text)
    layers, tokens = sent.cache.num_layers, sent.cache.length
    out = {"tokens": tokens, "layers": layers, "full_layers": full_layers or layers,
           "paper_bytes": PAPER["cache_bytes_per_token"], "quant": {}}
    for quant in QUANTS:
        per_token = len(encode_bundle([sent], quant=quant)) / tokens
        at_full = per_token / layers * (full_layers or layers)
        out["quant"][quant] = {"measured": per_token, "at_full_depth": at_full,
                               "paper_over_ours": PAPER["cache_bytes_per_token"] / at_full}
    return out


def scol_row(folder: str, device: torch.device, k: int = 2) -> dict:
    """One context: SCoL's best of K candidates against one sequential fine-tuning update."""
    cfg = dataclasses.replace(quick_config(), model=folder)
    model, tok = load_causal_lm(folder, dtype="float32", device=device)
    stream = contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")))[:1]
    out = {}
    for selection in ("best", "all"):
        c = dataclasses.replace(cfg.scol, k=k, reward="supervised")
        out[selection] = measure(lambda s=selection, c=c: consolidate_stream(
            copy.deepcopy(model), tok, stream, c, s), device)
    return _row(f"SCoL best of {k} vs one sequential fine-tuning update (1 context)",
                f"scol K={k}", "sequential FT", out["best"], out["all"])


def shape_layers(shape: str) -> int:
    """The published depth of ``shape``."""
    return SHAPES[shape]["num_hidden_layers"]


def run_shape_bench(shape: str, layers: int | None, batch: int = 4, dtype: str = "float32",
                    device: str = "cpu", progress: Callable[[str], None] = print) -> dict:
    """Every method's row at ``shape`` (cut to ``layers``; None = all)."""
    dev = torch.device(device)
    folder = resolve_model(f"shape:{shape}" + (f"@{layers}" if layers else ""))
    report = {"shape": shape, "layers": layers or "all", "batch": batch, "dtype": dtype,
              "device": str(dev), "machine": machine(), "rows": []}
    for name, fn in (("fednl", lambda: fednl_row(folder, batch, dtype, dev)),
                     ("refine", lambda: refine_row(folder, dtype, dev,
                                                   full_layers=shape_layers(shape))),
                     ("scol", lambda: scol_row(folder, dev))):
        progress(f"bench --shape {shape}: {name} ...")
        try:
            report["rows"].append(fn())
        except Exception as e:  # one method's failure must not hide the others' rows
            report["rows"].append({"comparison": name, "error": f"{type(e).__name__}: {e}",
                                   "traceback": traceback.format_exc()[-2000:]})
    report["lines"] = [shape_line(r) for r in report["rows"]]
    return report


def shape_line(r: dict) -> str:
    if "error" in r:
        return f"{r['comparison']}: failed: {r['error']}"
    mem = f"{r['memory_ratio']:.2f}x" if r["memory_ratio"] is not None else "n/a"
    line = (f"{r['comparison']}: {r['ours']} {r['ours_s']:.2f} s, {r['ours_mb']:.0f} MB vs "
            f"{r['peer']} {r['peer_s']:.2f} s, {r['peer_mb']:.0f} MB: time {r['time_ratio']:.2f}x,"
            f" peak memory {mem}")
    if "alone_s" in r:
        line += (f"; receiver alone {r['alone_s']:.2f} s (c2c {r['c2c_over_alone']:.2f}x, t2t "
                 f"{r['t2t_over_alone']:.2f}x of it)")
    if "wire" in r:
        w = r["wire"]
        line += (f"\n  bytes per transmitted token at {w['full_layers']} layers (measured at "
                 f"{w['layers']}, {w['tokens']} tokens; paper {w['paper_bytes'] / 1024:.0f} KB): "
                 + ", ".join(f"{q} {e['at_full_depth'] / 1024:.1f} KB"
                             for q, e in w["quant"].items()))
    return line
