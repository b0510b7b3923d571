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
from transformers import AutoTokenizer, DynamicCache

from plasticlm.config import override, to_dict
from plasticlm.data.context_tasks import load_client_streams
from plasticlm.data.corpus import load_text_corpus
from plasticlm.errors import PlasticError
from plasticlm.eval import (
    CI,
    format_ci,
    pooled_bootstrap_ci,
    qa_continuation,
    qa_line,
    qa_prompt,
    seed_ci,
)
from plasticlm.experiments.fednl.variants import (
    ExperimentConfig,
    Variant,
    federated_config,
    trained_model,
    variants,
)
from plasticlm.fednl.build import build_model
from plasticlm.fednl.report import PAPER_CELLS
from plasticlm.memory import MemoryStream
from plasticlm.models.specs import resolve_data, resolve_model
from plasticlm.outputs import prepare_output
from plasticlm.plotting import plt
from plasticlm.runtime import dtype_name

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


@torch.no_grad()
def stream_questions(model, tok, segments, chunk_tokens: int = 256) -> list[dict]:
    """Each question of one client stream answered where it is asked, from the stream's
    state (window cache and memory, never reset), by 4-way choice: the log-likelihood of
    each choice after ``Q: <question> A:``, the state restored after each; then the answered
    line joins the stream as in :func:`stream_ce`. Returns per question ``{"tokens":
    position in the stream, "lag": passages since its entity's, "scores": log-likelihood
    per choice, "correct": 1.0 | 0.0}``.
    Windowed models only (a full-attention model has no bounded stream state)."""
    stream = MemoryStream(model, chunk_tokens=chunk_tokens)
    device = next(model.parameters()).device

    def ids(text: str) -> torch.Tensor:
        return torch.tensor([tok(text, add_special_tokens=False)["input_ids"]], device=device)

    stream.feed(torch.tensor([[tok.bos_token_id]], device=device))
    out = []
    for i, seg in enumerate(segments):
        sep = "\n" if i else ""
        if seg.kind == "text":
            stream.feed(ids(sep + seg.text))
            continue
        stream.feed(ids(sep + qa_prompt(seg.text)))
        saved, scores = stream.state_dict(), []
        for choice in seg.choices:
            cont = ids(qa_continuation(choice))
            logits = torch.cat([saved["last_logits"], stream.feed(cont)[:, :-1]], dim=1)
            logp = torch.log_softmax(logits[0].float(), dim=-1)
            scores.append(logp.gather(1, cont[0, :, None]).sum().item())
            stream.load_state_dict(saved)
        out.append({"tokens": stream.position, "lag": seg.lag, "scores": scores,
                    "correct": float(max(range(len(scores)), key=scores.__getitem__)
                                     == seg.choices.index(seg.answer))})
        stream.feed(ids(qa_continuation(seg.answer) + "."))
    return out


def run_stream_experiment(cfg: ExperimentConfig, progress: bool = True) -> dict:
    """The final thetas of the ``cfg.stream_from`` runs (trained first if missing) read each
    domain's client stream; per variant and seed, the CE of every 256-token bucket divided
    by that of the first, averaged over the five streams."""
    ob = dataclasses.replace(cfg, experiment=cfg.stream_from)
    root = Path(cfg.out) / cfg.stream_from
    streams = load_client_streams(resolve_data(cfg.run.data.source) / "client_streams.jsonl")
    if cfg.stream_tokens:
        streams = long_streams(streams, cfg.stream_tokens,
                               AutoTokenizer.from_pretrained(resolve_model(cfg.run.model)))
    out: dict = {"config": to_dict(cfg), "variants": {}}
    for v in variants(ob):
        if v.window == 0 and not v.trained:
            continue
        per_seed, asked = [], []
        for seed in range(cfg.seeds):
            model, tok, _ = trained_model(federated_config(ob, v, seed, root), v.trained,
                                          progress, central=v.central)
            curves = [stream_ce(model, tok, segs, cfg.bucket_tokens, v.window)
                      for segs in streams.values()]
            k = min(len(c) for c in curves)
            if cfg.stream_tokens:
                k = min(k, cfg.stream_tokens // cfg.bucket_tokens)
            per_seed.append([sum(c[i] / c[0] for c in curves) / len(curves) for i in range(k)])
            if v.window and cfg.stream_questions:
                asked.append([stream_questions(model, tok, segs) for segs in streams.values()])
        k = min(len(c) for c in per_seed)
        out["variants"][v.label] = {
            "normalised_ce": [dataclasses.asdict(seed_ci([c[i] for c in per_seed]))
                              for i in range(k)],
            "last_bucket": dataclasses.asdict(seed_ci([c[k - 1] for c in per_seed])),
            **(_question_summary(asked) if asked else {})}
        if progress:
            log.info("stream %s: last bucket %.3f", v.label,
                     out["variants"][v.label]["last_bucket"]["mean"])
    lines = [f"| stream: variant | normalised CE, last {cfg.bucket_tokens}-token bucket "
             "[95% CI over seeds] | change | paper | in-stream questions, % [95% CI] | "
             "late minus early questions, pp [95% CI over seeds] |", "|---|---|---|---|---|---|"]
    for label, r in out["variants"].items():
        last = CI(**r["last_bucket"])
        q = (f"{format_ci(CI(**r['questions']))} | {format_ci(CI(**r['late_minus_early']))}"
             if "questions" in r else "- | -")
        lines.append(f"| {label} | {format_ci(last, 1, 3)} | {100 * (last.mean - 1):+.1f}% | "
                     f"{PAPER_CELLS['stream'].get(label, '-')} | {q} |")
    k = len(next(iter(out["variants"].values()))["normalised_ce"])
    reach = (f" read to {k * cfg.bucket_tokens} tokens, each domain's own stream continued by "
             "the other domains' in turn" if cfg.stream_tokens else "")
    out["table"] = "\n".join(lines) + (
        f"\n\n{len(streams)} client streams, one per domain{reach}, {cfg.seeds} seeds of the "
        f"{cfg.stream_from} runs' thetas. In-stream questions: each asked where it stands in "
        "the stream, answered by 4-way choice from the stream's state (chance 25%; windowed "
        "rows only), the halves split at half the last question's position in each stream.")
    root_s = prepare_output(Path(cfg.out) / "stream", "experiment",
                            hint="choose another --set out=...")
    (root_s / "results.json").write_text(json.dumps(out, indent=1) + "\n")
    (root_s / "table.md").write_text(out["table"] + "\n")
    return out


def long_streams(streams: dict[str, list], tokens: int, tok) -> dict[str, list]:
    """Domain -> list of :class:`~plasticlm.sandbox.tasks.StreamSegment`: each domain's
    stream continued by the other domains' streams in turn (its own again after the last)
    until its segments' text holds at least ``tokens`` tokens of ``tok`` (questions' answers
    not counted, so the stream read is a little longer); ``tokens`` = 0 leaves the streams
    as they are."""
    if not tokens:
        return streams
    names = list(streams)
    sizes = {n: len(tok("\n".join(s.text for s in segs), add_special_tokens=False)["input_ids"])
             for n, segs in streams.items()}
    if not sum(sizes.values()):
        raise PlasticError("the client streams hold no text to read")
    out = {}
    for i, name in enumerate(names):
        segs, n, j = [], 0, 0
        while n < tokens:
            part = names[(i + j) % len(names)]
            segs += streams[part]
            n += sizes[part]
            j += 1
        out[name] = segs
    return out


def _question_summary(asked: list[list[list[dict]]]) -> dict:
    """Accuracy of every in-stream question pooled over seeds ([seed][stream][question]),
    and per seed the late questions' accuracy minus the early ones' (split, per stream, at
    half the last question's position), with a t-interval over seeds; empty when a seed's
    streams hold no question."""
    pooled = [[q["correct"] for stream in seed for q in stream] for seed in asked]
    if not all(pooled):  # streams too short to hold a question (the quick world's)
        return {}
    diffs = []
    for seed in asked:
        early, late = [], []
        for stream in seed:
            middle = stream[-1]["tokens"] / 2 if stream else 0
            for q in stream:
                (late if q["tokens"] > middle else early).append(q["correct"])
        diffs.append(sum(late) / max(1, len(late)) - sum(early) / max(1, len(early)))
    return {"questions": dataclasses.asdict(pooled_bootstrap_ci(pooled)),
            "late_minus_early": dataclasses.asdict(seed_ci(diffs)),
            "questions_per_seed": len(pooled[0])}


def _world_tokens(tok, data: str, n: int) -> torch.Tensor:
    """``[1, n]`` token ids of the world's held-out text, repeated as needed."""

    folder = resolve_data(data)
    ids = tok("\n".join(d.text for d in load_text_corpus(folder / "corpus" / "valid.txt")),
              add_special_tokens=False)["input_ids"]
    return torch.tensor([(ids * (n // len(ids) + 1))[:n]])


@torch.no_grad()
def run_memory_experiment(cfg: ExperimentConfig, progress: bool = True) -> dict:
    """Bytes the receiver carries after T tokens of text: FedNL's memory stream (window
    ``run.method.window`` plus one delta-rule state per head) against a full-attention KV cache,
    both measured on the live objects, fed in 512-token chunks."""
    fcfg = federated_config(cfg, Variant("fednl", (("method.name", "fednl"),)), 0,
                            Path(cfg.out))
    model, tok = build_model(fcfg)
    ids = _world_tokens(tok, cfg.run.data.source, max(cfg.memory_tokens))
    stream = MemoryStream(model, chunk_tokens=512)
    marks, rows, t0 = sorted(cfg.memory_tokens), [], time.time()
    for start in range(0, ids.shape[1], 512):
        stream.feed(ids[:, start:start + 512], keep="last")
        if start + 512 in marks:
            rows.append({"tokens": start + 512, "memory_bytes": stream.state_bytes(),
                         "memory_seconds": round(time.time() - t0, 2)})
    base, _ = build_model(override(fcfg, {"method.name": "fedavg", "method.window": 0}))
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
    lines = [f"| tokens | FedNL stream state (window {cfg.run.method.window} + memory), KiB | "
             "full-attention KV cache, KiB | ratio |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['tokens']} | {r['memory_bytes'] / 1024:.0f} | "
                     f"{r['kv_bytes'] / 1024:.0f} | {r['kv_bytes'] / r['memory_bytes']:.1f}x |")
    out = {"config": to_dict(cfg), "rows": rows,
           "table": "\n".join(lines) + "\n\nMeasured on the live stream state and DynamicCache "
                    f"({dtype_name(param.dtype)}); the paper reports no OOM at "
                    "16K tokens for FedNL."}
    root = prepare_output(Path(cfg.out) / "memory", "experiment",
                          hint="choose another --set out=...")
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
