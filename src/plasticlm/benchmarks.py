"""``plasticlm bench``: performance comparisons side by side, each a ratio against a named
peer, measured in one run (JSON and a PNG).

- the delta rule, forward and forward+backward: the chunkwise kernel against transformers'
  ``torch_chunk_gated_delta_rule`` (Qwen3-Next's) and against the recurrent form;
- inference state after T tokens: FedNL's memory stream (window + one state per head)
  against a full-attention KV cache of the same model;
- bytes on the wire per client and round: FedNL's theta against LoRA-FedAvg at the same
  rank and against full FedAvg, on the same model;
- the delta rule's distance from the matmul floor: its FLOPs at this machine's dense-GEMM
  rate;
- FedRefine's time to first token and bytes, c2c against t2t, in one process and over links
  of 1-100 MB/s (the link model), at the sandbox family's sizes;
- SCoL's wall time per context (best of K candidates) against one sequential fine-tuning
  update of the same model.

The detailed, longer benchmarks (peak RSS, MQAR, SCoL cost, ...) are scripts in ``bench/``.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

from plasticlm.data.squad import load_squad
from plasticlm.errors import PlasticError
from plasticlm.fednl.methods import MethodConfig, prepare_model
from plasticlm.fednl.theta import get_theta
from plasticlm.memory import MemoryStream, attach_memory
from plasticlm.memory.ops import delta_rule_chunkwise, delta_rule_recurrent
from plasticlm.models import build_tiny, train_bpe_tokenizer
from plasticlm.plotting import plt
from plasticlm.refine import FedRefine, Fuser, Link, Peer
from plasticlm.refine.modes import RefineConfig
from plasticlm.refine.report import LINK_MB_PER_S, link_latency_ms
from plasticlm.runs import write_text_atomic
from plasticlm.runtime import machine
from plasticlm.scol.contexts import contexts_from_passages
from plasticlm.scol.meta import consolidate_stream
from plasticlm.scol.setup import ExperimentConfig, quick_config, resolve_world_file
from plasticlm.scol.setup import load_model as load_scol_model


def delta_rule_inputs(t: int, b: int = 1, h: int = 4, d: int = 64, seed: int = 0):
    """(q, k, v, beta) of shapes [B, H, T, D] x3 and [B, H, T]; keys L2-normalised."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, d, generator=gen)
    k = F.normalize(torch.randn(b, h, t, d, generator=gen), dim=-1)
    v = torch.randn(b, h, t, d, generator=gen)
    beta = torch.rand(b, h, t, generator=gen)
    return q, k, v, beta


def delta_rule_runners(chunk: int = 64) -> dict[str, Callable]:
    """Ours (chunkwise, recurrent) and transformers' reference on the same inputs; the
    reference takes [B, T, H, D] and scales q by Dk^-0.5, so ours get q * Dk^-0.5."""
    def chunkwise(q, k, v, beta):
        return delta_rule_chunkwise(q * q.shape[-1] ** -0.5, k, v, beta, chunk_size=chunk)

    def recurrent(q, k, v, beta):
        return delta_rule_recurrent(q * q.shape[-1] ** -0.5, k, v, beta)

    def transformers_ref(q, k, v, beta):
        b, h, t, _ = q.shape
        o, s = torch_chunk_gated_delta_rule(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), torch.zeros(b, t, h),
            beta.transpose(1, 2), chunk_size=64, output_final_state=True)
        return o.transpose(1, 2), s

    return {"chunkwise": chunkwise, "recurrent": recurrent, "transformers": transformers_ref}


def run_once(fn: Callable, inputs, backward: bool):
    """Seconds of one ``fn(*inputs)`` (with a backward pass through outputs and state when
    ``backward``) and its outputs."""
    leaves = [x.clone().requires_grad_(backward) for x in inputs]
    start = time.perf_counter()
    if backward:
        o, s = fn(*leaves)
        (o.sum() + s.sum()).backward()
    else:
        with torch.no_grad():
            o, s = fn(*leaves)
    return time.perf_counter() - start, (o.detach(), s.detach())


def timed_side_by_side(fns: dict[str, Callable], inputs, backward: bool, reps: dict[str, int]):
    """Best-of-``reps[name]`` seconds of each runner after one untimed warm-up, the runners
    taking turns in every round, and their last outputs. The minimum, as timeit advises:
    another job on a shared machine only ever adds time, and taking turns exposes every
    runner to the same drift."""
    best, outs = {}, {}
    for r in range(max(reps.values()) + 1):
        for name, fn in fns.items():
            if r > reps[name]:
                continue
            seconds, outs[name] = run_once(fn, inputs, backward)
            if r:
                best[name] = min(best.get(name, float("inf")), seconds)
    return best, outs


def matmul_gflops(size: int = 512, reps: int = 10) -> float:
    """This machine's dense float32 GEMM rate (GFLOP/s) at the current thread count."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * size**3 / min(times) / 1e9


def chunkwise_flops(b: int, h: int, t: int, d: int, chunk: int = 64) -> float:
    """Matmul FLOPs of the ungated chunkwise forward (d = dk = dv): per chunk five C x C x d
    products (K K^T, two solves' right sides, Q K^T, intra x U), the block-doubling inverse
    (~4/3 C^3) and three C x d x d state products."""
    c = chunk
    per_chunk = 2 * (5 * c * c * d + 3 * c * d * d) + 4 * c**3 / 3
    return b * h * -(-t // c) * per_chunk


def delta_rule_rows(lengths: list[int], reps: int = 5, chunk: int = 64) -> list[dict]:
    """Per T and mode (fwd, fwd+bwd): seconds of each runner, the ratios, the largest
    difference of outputs and final state against each peer, and the chunkwise kernel's
    multiple of the matmul floor (its FLOPs at the dense-GEMM rate; fwd+bwd counted as 3x
    the forward's FLOPs)."""
    fns = delta_rule_runners(chunk)
    rate = matmul_gflops() * 1e9
    rows = []
    for t in lengths:
        inputs = delta_rule_inputs(t)
        for backward in (False, True):
            row = {"T": t, "mode": "fwd+bwd" if backward else "fwd"}
            n = {name: 1 if name == "recurrent" and t >= 4096 else reps for name in fns}
            best, outs = timed_side_by_side(fns, inputs, backward, n)
            row.update({f"{name}_s": seconds for name, seconds in best.items()})
            for name in ("recurrent", "transformers"):
                row[f"max_abs_diff_o_vs_{name}"] = float(
                    (outs["chunkwise"][0] - outs[name][0]).abs().max())
                row[f"max_abs_diff_state_vs_{name}"] = float(
                    (outs["chunkwise"][1] - outs[name][1]).abs().max())
            row["speedup_vs_transformers"] = row["transformers_s"] / row["chunkwise_s"]
            row["speedup_vs_recurrent"] = row["recurrent_s"] / row["chunkwise_s"]
            b, h, _, d = inputs[0].shape
            row["floor_s"] = (3 if backward else 1) * chunkwise_flops(b, h, t, d, chunk) / rate
            row["over_floor"] = row["chunkwise_s"] / row["floor_s"]
            row["gemm_gflops"] = rate / 1e9
            rows.append(row)
    return rows


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
    def theta_bytes(method: MethodConfig) -> int:
        return sum(x.numel() * 4 for x in get_theta(prepare_model(_tiny(), method)).values())

    fednl = theta_bytes(MethodConfig(name="fednl", window=64))
    rows = [{"peer": "LoRA-FedAvg, same rank",
             "peer_bytes": theta_bytes(MethodConfig(name="fedavg", window=64))},
            {"peer": "full FedAvg (every weight)",
             "peer_bytes": theta_bytes(MethodConfig(name="fedavg-full", window=64))}]
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
    cfg.scol.k, cfg.scol.temperature = k, 2.0   # explore, so K distinct candidates are trained
    model, tok = load_scol_model(cfg)
    stream = contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")))[:contexts]
    rows = []
    for name, selection, together in (("sequential fine-tuning (all layers)", "all", False),
                                      (f"SCoL best of {k}", "best", True)):
        c = copy.deepcopy(cfg.scol)
        c.reward, c.together = "supervised", together
        t0 = time.perf_counter()
        _, records, _ = consolidate_stream(copy.deepcopy(model), tok, stream, c, selection)
        rows.append({"method": name, "seconds_per_context": (time.perf_counter() - t0)
                     / len(stream), "candidates": statistics.mean(len(r.candidates)
                                                                  for r in records)})
    return rows


def run_bench(out: str | Path, quick: bool = False, threads: int = 1) -> dict:
    """Every comparison; writes ``bench.json``, ``bench.md`` and ``bench.png`` into ``out``."""
    if threads < 1:
        raise PlasticError(f"threads must be >= 1, not {threads}")
    torch.set_num_threads(threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    report = {
        "setup": {"threads": threads, "quick": quick, **machine(),
                  "load_average": list(os.getloadavg())},
        "delta_rule": delta_rule_rows([256] if quick else [512, 2048, 8192], reps=1 if quick else 5),
        "state": state_rows([512, 1024] if quick else [1024, 4096, 16384]),
        "wire": wire_rows(),
        "refine": refine_rows(prompts=3 if quick else 6, reps=1 if quick else 3),
        "scol": scol_rows("quick" if quick else "sandbox", contexts=1 if quick else 2),
    }
    report["seconds"] = round(time.time() - t0, 1)
    report["lines"] = ratio_lines(report)
    write_text_atomic(out / "bench.json", json.dumps(report, indent=1) + "\n")
    write_text_atomic(out / "bench.md", "\n".join(f"- {x}" for x in report["lines"]) + "\n")
    _plot(report, out / "bench.png")
    return report


def ratio_lines(report: dict) -> list[str]:
    """One line per comparison: what, ours, the peer, the ratio."""
    lines = []
    for r in report["delta_rule"]:
        lines.append(f"delta rule {r['mode']}, T={r['T']}: chunkwise {1000 * r['chunkwise_s']:.1f} "
                     f"ms vs transformers' torch_chunk_gated_delta_rule "
                     f"{1000 * r['transformers_s']:.1f} ms: {r['speedup_vs_transformers']:.2f}x "
                     f"as fast; vs the recurrent form {r['speedup_vs_recurrent']:.2f}x; "
                     f"{r['over_floor']:.1f}x the matmul floor ({1000 * r['floor_s']:.1f} ms "
                     f"at {r['gemm_gflops']:.0f} GFLOP/s)")
    for r in report["state"]:
        lines.append(f"state after {r['T']} tokens: memory stream {r['stream_bytes'] / 1024:.0f} "
                     f"KiB vs full KV cache {r['kv_cache_bytes'] / 1024:.0f} KiB: "
                     f"{r['ratio']:.1f}x less")
    for r in report["wire"]:
        lines.append(f"bytes per client and round: FedNL theta {r['fednl_bytes'] / 1e3:.1f} KB vs "
                     f"{r['peer']} {r['peer_bytes'] / 1e3:.1f} KB: the peer sends "
                     f"{r['ratio']:.2f}x FedNL's bytes")
    by_mode = {r["mode"]: r for r in report["refine"]}
    c2c, t2t = by_mode["c2c"], by_mode["t2t"]
    lines.append(f"FedRefine time to first token: c2c {c2c['ttft_ms']:.0f} ms vs t2t "
                 f"{t2t['ttft_ms']:.0f} ms ({t2t['background_tokens']:.1f} background tokens): "
                 f"{t2t['ttft_ms'] / c2c['ttft_ms']:.2f}x as fast; alone "
                 f"{by_mode['alone']['ttft_ms']:.0f} ms")
    for speed in c2c["link_ms"]:
        lines.append(f"FedRefine over a {speed} MB/s link (+20 ms round trip): c2c "
                     f"{c2c['link_ms'][speed]:.0f} ms ({c2c['wire_bytes'] / 1e3:.1f} KB) vs t2t "
                     f"{t2t['link_ms'][speed]:.0f} ms ({t2t['wire_bytes']:.0f} B): "
                     f"{t2t['link_ms'][speed] / c2c['link_ms'][speed]:.2f}x as fast")
    seq, scol = report["scol"]
    lines.append(f"SCoL per context: {scol['method']} {scol['seconds_per_context']:.1f} s vs "
                 f"{seq['method']} {seq['seconds_per_context']:.1f} s: "
                 f"{scol['seconds_per_context'] / seq['seconds_per_context']:.1f}x the cost")
    return lines


def _plot(report: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    for mode, marker in (("fwd", "o"), ("fwd+bwd", "s")):
        rows = [r for r in report["delta_rule"] if r["mode"] == mode]
        axes[0].plot([r["T"] for r in rows], [r["speedup_vs_transformers"] for r in rows],
                     marker=marker, label=mode)
    axes[0].axhline(1, color="k", lw=0.8)
    axes[0].set(xscale="log", xlabel="T", ylabel="x faster than transformers' reference",
                title="delta rule")
    axes[0].legend()
    t = [r["T"] for r in report["state"]]
    axes[1].plot(t, [r["stream_bytes"] / 2**20 for r in report["state"]], marker="o",
                 label="memory stream")
    axes[1].plot(t, [r["kv_cache_bytes"] / 2**20 for r in report["state"]], marker="s",
                 label="full KV cache")
    axes[1].set(xscale="log", yscale="log", xlabel="tokens", ylabel="MiB", title="state")
    axes[1].legend()
    axes[2].bar(["FedNL"] + [r["peer"] for r in report["wire"]],
                [report["wire"][0]["fednl_bytes"] / 1e3] + [r["peer_bytes"] / 1e3
                                                            for r in report["wire"]])
    axes[2].set(yscale="log", ylabel="KB per client and round", title="bytes on the wire")
    axes[2].tick_params(axis="x", labelsize=7)
    speeds = list(report["refine"][0]["link_ms"])
    for r in report["refine"]:
        axes[3].plot([float(x) for x in speeds], [r["link_ms"][x] for x in speeds], marker="o",
                     label=r["mode"])
    axes[3].set(xscale="log", xlabel="link MB/s", ylabel="ms to first token",
                title="FedRefine over a link")
    axes[3].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
