"""FedNL's streaming experiments: a client's memory read over its whole stream (cross-entropy
per bucket, never reset), and the bytes the receiver carries after T tokens against a full
KV cache."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from plasticlm.data.corpus import load_text_corpus
from plasticlm.eval import CI, format_ci, qa_line, seed_ci
from plasticlm.fednl.methods import MethodConfig
from plasticlm.fednl.report import PAPER_CELLS
from plasticlm.fednl.setup import build_model
from plasticlm.fednl.variants import (
    ExperimentConfig,
    Variant,
    federated_config,
    trained_model,
    variants,
)
from plasticlm.memory import MemoryStream
from plasticlm.plotting import plt
from plasticlm.runs import dtype_name
from plasticlm.sandbox import resolve_data_spec
from plasticlm.sandbox.tasks import load_client_streams

log = logging.getLogger("plasticlm.fednl")


def stream_ce(model, tok, segments, bucket: int, window: int) -> list[float]:
    """Mean next-token cross-entropy per ``bucket`` tokens of one client stream (passages and
    answered questions, never reset), read with the model's window (0 = full attention)."""
    text = "\n".join(s.text if s.kind == "text" else qa_line(s.text, s.answer) for s in segments)
    ids = torch.tensor([[tok.bos_token_id, *tok(text, add_special_tokens=False)["input_ids"]]],
                       device=next(model.parameters()).device)
    if window > 0:
        logits = MemoryStream(model, chunk_tokens=256).feed(ids)
    else:
        with torch.no_grad():
            logits = model(input_ids=ids).logits
    ce = torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="none")
    return [ce[i:i + bucket].mean().item() for i in range(0, len(ce) - bucket + 1, bucket)]


def run_stream_experiment(cfg: ExperimentConfig, progress: bool = True) -> dict:
    """The final thetas of the ``cfg.stream_from`` runs (trained first if missing) read each
    domain's client stream; per variant and seed, the CE of every 256-token bucket divided
    by that of the first, averaged over the five streams."""
    ob = dataclasses.replace(cfg, experiment=cfg.stream_from)
    root = Path(cfg.out) / cfg.stream_from
    streams = load_client_streams(resolve_data_spec(cfg.data) / "client_streams.jsonl")
    out: dict = {"config": dataclasses.asdict(cfg), "variants": {}}
    for v in variants(ob):
        if v.window == 0 and not v.trained:
            continue
        per_seed = []
        for seed in range(cfg.seeds):
            model, tok, _ = trained_model(federated_config(ob, v, seed, root), v.trained,
                                          progress)
            curves = [stream_ce(model, tok, segs, cfg.bucket_tokens, v.window)
                      for segs in streams.values()]
            k = min(len(c) for c in curves)
            per_seed.append([sum(c[i] / c[0] for c in curves) / len(curves) for i in range(k)])
        k = min(len(c) for c in per_seed)
        out["variants"][v.label] = {
            "normalised_ce": [dataclasses.asdict(seed_ci([c[i] for c in per_seed]))
                              for i in range(k)],
            "last_bucket": dataclasses.asdict(seed_ci([c[k - 1] for c in per_seed]))}
        if progress:
            log.info("stream %s: last bucket %.3f", v.label,
                     out["variants"][v.label]["last_bucket"]["mean"])
    lines = [f"| stream: variant | normalised CE, last {cfg.bucket_tokens}-token bucket "
             "[95% CI over seeds] | change | paper |", "|---|---|---|---|"]
    for label, r in out["variants"].items():
        last = CI(**r["last_bucket"])
        lines.append(f"| {label} | {format_ci(last, 1, 3)} | {100 * (last.mean - 1):+.1f}% | "
                     f"{PAPER_CELLS['stream'].get(label, '-')} |")
    out["table"] = "\n".join(lines) + (f"\n\n{len(streams)} client streams, one per domain, "
                                       f"{cfg.seeds} seeds of the {cfg.stream_from} runs' "
                                       "thetas.")
    root_s = Path(cfg.out) / "stream"
    root_s.mkdir(parents=True, exist_ok=True)
    (root_s / "results.json").write_text(json.dumps(out, indent=1) + "\n")
    (root_s / "table.md").write_text(out["table"] + "\n")
    return out


def _world_tokens(tok, data: str, n: int) -> torch.Tensor:
    """``[1, n]`` token ids of the world's held-out text, repeated as needed."""

    folder = resolve_data_spec(data)
    ids = tok("\n".join(d.text for d in load_text_corpus(folder / "corpus" / "valid.txt")),
              add_special_tokens=False)["input_ids"]
    return torch.tensor([(ids * (n // len(ids) + 1))[:n]])


@torch.no_grad()
def run_memory_experiment(cfg: ExperimentConfig, progress: bool = True) -> dict:
    """Bytes the receiver carries after T tokens of text: FedNL's memory stream (window
    ``cfg.window`` plus one delta-rule state per head) against a full-attention KV cache,
    both measured on the live objects, fed in 512-token chunks."""
    fcfg = federated_config(cfg, Variant("fednl", "fednl", cfg.window), 0, Path(cfg.out))
    model, tok = build_model(fcfg)
    ids = _world_tokens(tok, cfg.data, max(cfg.memory_tokens))
    stream = MemoryStream(model, chunk_tokens=512)
    marks, rows, t0 = sorted(cfg.memory_tokens), [], time.time()
    for start in range(0, ids.shape[1], 512):
        stream.feed(ids[:, start:start + 512], keep="last")
        if start + 512 in marks:
            rows.append({"tokens": start + 512, "memory_bytes": stream.state_bytes(),
                         "memory_seconds": round(time.time() - t0, 2)})
    base, _ = build_model(dataclasses.replace(fcfg, method=MethodConfig(name="fedavg",
                                                                         window=0)))
    cache, t0, i = DynamicCache(), time.time(), 0
    param = next(base.parameters())
    for start in range(0, ids.shape[1], 512):
        chunk = ids[:, start:start + 512].to(param.device)
        positions = torch.arange(start, start + chunk.shape[1], device=param.device)[None]
        out = base(input_ids=chunk, position_ids=positions, cache=cache, use_cache=True)
        cache = getattr(out, "cache", None) or cache
        if start + 512 in marks:
            kv = sum(t.numel() * t.element_size() for layer in cache.layers
                     for t in (layer.keys, layer.values))
            rows[i].update(kv_bytes=kv, kv_seconds=round(time.time() - t0, 2))
            i += 1
    lines = [f"| tokens | FedNL stream state (window {cfg.window} + memory), KiB | "
             "full-attention KV cache, KiB | ratio |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['tokens']} | {r['memory_bytes'] / 1024:.0f} | "
                     f"{r['kv_bytes'] / 1024:.0f} | {r['kv_bytes'] / r['memory_bytes']:.1f}x |")
    out = {"config": dataclasses.asdict(cfg), "rows": rows,
           "table": "\n".join(lines) + "\n\nMeasured on the live stream state and DynamicCache "
                    f"({dtype_name(param.dtype)}); the paper reports no OOM at "
                    "16K tokens for FedNL."}
    root = Path(cfg.out) / "memory"
    root.mkdir(parents=True, exist_ok=True)
    (root / "results.json").write_text(json.dumps(out, indent=1) + "\n")
    (root / "table.md").write_text(out["table"] + "\n")
    _plot_memory(rows, root / "memory.png")
    return out


def _plot_memory(rows: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    t = [r["tokens"] for r in rows]
    ax.plot(t, [r["memory_bytes"] / 2**20 for r in rows], marker="o", label="FedNL stream state")
    ax.plot(t, [r["kv_bytes"] / 2**20 for r in rows], marker="s", label="full KV cache")
    ax.set(xlabel="tokens read", ylabel="MiB carried", xscale="log", yscale="log",
           title="inference state vs context length")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
