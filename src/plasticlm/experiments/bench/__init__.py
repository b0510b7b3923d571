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
Here: ``run_bench``, the report and its plot; the delta rule's timings in ``delta_rule``, the
methods' comparisons in ``methods``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from plasticlm.errors import PlasticError
from plasticlm.experiments.bench.delta_rule import delta_rule_rows
from plasticlm.experiments.bench.methods import refine_rows, scol_rows, state_rows, wire_rows
from plasticlm.outputs import prepare_output
from plasticlm.plotting import plt
from plasticlm.runs import write_text_atomic
from plasticlm.runtime import machine


def run_bench(out: str | Path, quick: bool = False, threads: int = 1) -> dict:
    """Every comparison; writes ``bench.json``, ``bench.md`` and ``bench.png`` into ``out``."""
    if threads < 1:
        raise PlasticError(f"threads must be >= 1, not {threads}")
    torch.set_num_threads(threads)
    out = prepare_output(out, "run", hint="give another --out")
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
