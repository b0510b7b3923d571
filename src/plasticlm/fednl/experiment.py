"""The FedNL paper's experiments, each beside the controls a trivial system would need to beat.

``plasticlm fednl experiment NAME`` runs, for every seed, each variant of NAME as a real
Flower federation (:func:`plasticlm.fednl.run.run_federated`), then scores the final global
theta item by item on every client's held-out data, so that accuracies carry entity-clustered
bootstrap intervals pooled over seeds and differences are paired on the same items
(:mod:`plasticlm.eval.stats`).

- ``mmlu``: closed-book, the five domain clients in the pre-training QA template.
- ``niah``: seven NIAH clients (one task each), needle far beyond a W-token window.
- ``openbook``: five domain clients; an unseen entity's passage, filler, then a question
  beyond the window; test items are about entities the client never trained on.
- ``stream``: the openbook runs' thetas read each domain's client stream (2-4K tokens, one
  memory, never reset): cross-entropy per 256-token bucket, normalised by the first.
- ``memory``: bytes the receiver carries after T tokens, memory stream vs full KV cache.
- ``comm``: bytes per round like for like (equal LoRA rank, equal theta bytes, full model).

Every finished (variant, seed) is kept in ``results.json``; a re-run continues where it
stopped.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from plasticlm.errors import PlasticError
from plasticlm.eval import CI, format_ci, pooled_bootstrap_ci, seed_ci, verdict
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.methods import MethodConfig, get_theta, set_theta
from plasticlm.fednl.report import PAPER
from plasticlm.fednl.setup import build_model, tasks_for

EXPERIMENTS = ("mmlu", "niah", "openbook", "stream", "memory", "comm")

# The paper's figures (report.PAPER; Qwen2.5-1.5B, its NIAH contexts far longer than ours,
# its MMLU accuracy including the base model's prior knowledge: neither comparable in level)
# as the cells of each experiment's table.
PAPER_CELLS = {
    "mmlu": {"fednl": f"{PAPER['mean_acc']['fednl']:.2f}",
             "best baseline": f"{PAPER['mean_acc']['fedssi']:.2f} (FedSSI)"},
    "niah": {"fednl": f"{PAPER['niah_acc']['fednl']:.1f}",
             "best baseline": f"{PAPER['niah_acc']['fedala']:.1f} (FedALA)"},
    "stream": {"fednl": f"{PAPER['stream_ce_change']['fednl']:+.1f}%",
               "fedavg LoRA, window": f"{PAPER['stream_ce_change']['fedavg']:+.1f}%"},
}


@dataclass(frozen=True)
class Variant:
    """One row: a method at an attention window (0 = full), or a control."""

    label: str
    method: str
    window: int
    recurrent: bool = True
    trained: bool = True
    decay: bool = False           # fednl: the gated delta rule

    @property
    def key(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.label).strip("-")


@dataclass
class ExperimentConfig:
    """Sizes of ``plasticlm fednl experiment`` (loadable from TOML/YAML, ``--set`` overrides)."""

    experiment: str = "niah"
    seeds: int = 3
    window: int = 16              # beyond-window experiments: W in tokens
    rounds: int = 3
    local_steps: int = 12
    batch_size: int = 8
    max_train: int = 48           # per client
    max_test: int = 48            # per client
    niah_length: int = 160        # tokens per NIAH sample (10 W; multikey needs >= 160)
    lr: float = 2e-3
    model: str = "sandbox:receiver"
    data: str = "sandbox"
    out: str = "runs/fednl-experiments"
    memory_tokens: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384])
    bucket_tokens: int = 256      # stream: CE bucket
    stream_from: str = "openbook" # stream: whose runs' thetas read the streams (openbook | niah)

    def __post_init__(self):
        if self.experiment not in EXPERIMENTS:
            raise PlasticError(f"unknown experiment {self.experiment!r}; choose one of "
                               f"{', '.join(EXPERIMENTS)} (or 'all')")
        if self.stream_from not in ("openbook", "niah"):
            raise PlasticError(f"stream_from must be 'openbook' or 'niah', not "
                               f"{self.stream_from!r}")
        if self.seeds < 1 or self.rounds < 1 or self.window < 1:
            raise PlasticError("seeds, rounds and window must be >= 1")


def variants(cfg: ExperimentConfig) -> list[Variant]:
    w = cfg.window
    if cfg.experiment == "mmlu":
        w = 64  # every item fits: a closed-book test of the method, not of the window
        return [Variant("fednl", "fednl", w), Variant("fedavg LoRA, window", "fedavg", w),
                Variant("fedprox", "fedprox", w), Variant("fedssi", "fedssi", w),
                Variant("fedala", "fedala", w),
                Variant("untrained", "fedavg", w, trained=False)]
    return [Variant("fednl", "fednl", w),
            Variant("fednl, decay", "fednl", w, decay=True),
            Variant("fednl, recurrence removed", "fednl", w, recurrent=False),
            Variant("fedavg LoRA, window", "fedavg", w),
            Variant("fedavg LoRA, full attention", "fedavg", 0),
            Variant("untrained, window", "fedavg", w, trained=False)]


def federated_config(cfg: ExperimentConfig, v: Variant, seed: int, root: Path) -> FedNLConfig:
    # memory and comm need no client data to train on; they measure the mmlu clients' model
    split = {"niah": "niah", "openbook": "openbook"}.get(cfg.experiment, "domain")
    method = MethodConfig(name=v.method, window=v.window, memory_recurrent=v.recurrent,
                          memory_decay=v.decay,
                          local_steps=cfg.local_steps, batch_size=cfg.batch_size, lr=cfg.lr)
    return FedNLConfig(name=f"{v.key}-s{seed}", model=cfg.model, data=cfg.data, split=split,
                       max_train=cfg.max_train, max_test=cfg.max_test,
                       niah_length=cfg.niah_length, rounds=cfg.rounds, seed=seed,
                       min_clients=1, local_eval="last", out=str(root), method=method)


def trained_model(fcfg: FedNLConfig, trained: bool, progress: bool = True):
    """(model with the final global theta of ``fcfg``'s Flower run, tokenizer, summary); the
    run is reused when its folder holds a finished run of the same config."""
    from safetensors.torch import load_file

    from plasticlm.fednl.run import run_federated

    model, tok = build_model(fcfg)
    if not trained:
        return model, tok, None
    run_dir = Path(fcfg.out) / fcfg.name
    # the saved config is read back through the dataclass, so a run written before a field
    # existed matches when the new field holds its default
    done = (run_dir / "summary.json").exists() and (run_dir / "config.json").exists() and \
        FedNLConfig.from_json((run_dir / "config.json").read_text()).to_json() == fcfg.to_json()
    if not done:
        if progress:
            print(f"[fednl experiment] {fcfg.name}: {fcfg.rounds} rounds on Flower", flush=True)
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_federated(fcfg)
    theta = load_file(str(sorted(run_dir.glob("round_*/theta.safetensors"))[-1]))
    set_theta(model, theta)
    return model, tok, json.loads((run_dir / "summary.json").read_text())


def _score(cfg: ExperimentConfig, v: Variant, seed: int, root: Path, progress: bool) -> dict:
    t0 = time.time()
    fcfg = federated_config(cfg, v, seed, root)
    model, tok, summary = trained_model(fcfg, v.trained, progress)
    correct, groups, per_client = [], [], {}
    for task in tasks_for(fcfg):
        c = task.correct(model, tok)
        per_client[task.name] = sum(c) / len(c)
        correct += c
        groups += [f"{task.name}/{g}" for g in task.groups()]
    out = {"correct": correct, "groups": groups, "per_client": per_client,
           "accuracy": sum(correct) / len(correct), "seconds": round(time.time() - t0, 1),
           "theta_bytes": sum(x.numel() * 4 for x in get_theta(model).values())}
    if summary:
        out.update(drop=summary["mean_drop"], mb_per_round=summary["mb_per_round"],
                   train_seconds=round(summary["seconds"], 1))
    return out


def _load_results(path: Path, cfg: ExperimentConfig) -> dict:
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("config") == dataclasses.asdict(cfg):
            return saved
    return {"config": dataclasses.asdict(cfg), "runs": {}}


def run_accuracy_experiment(cfg: ExperimentConfig, progress: bool = True) -> dict:
    """mmlu / niah / openbook: every variant x seed, scored per item; returns the results."""
    root = Path(cfg.out) / cfg.experiment
    root.mkdir(parents=True, exist_ok=True)
    path = root / "results.json"
    results = _load_results(path, cfg)
    for seed in range(cfg.seeds):
        for v in variants(cfg):
            key = f"{v.label}|{seed}"
            if key in results["runs"]:
                continue
            results["runs"][key] = _score(cfg, v, seed, root, progress)
            r = results["runs"][key]
            if progress:
                print(f"[fednl experiment] {cfg.experiment} seed {seed} {v.label}: "
                      f"{100 * r['accuracy']:.1f}% ({r['seconds']:.0f} s)", flush=True)
            path.write_text(json.dumps(results) + "\n")
    results["table"] = accuracy_table(cfg, results)
    path.write_text(json.dumps(results) + "\n")
    (root / "table.md").write_text(results["table"] + "\n")
    _plot_accuracy(cfg, results, root / "accuracy.png")
    return results


def finished_seeds(cfg: ExperimentConfig, results: dict) -> list[int]:
    """Seeds whose every variant has finished (a table of an interrupted experiment uses
    these and says how many there are)."""
    return [s for s in range(cfg.seeds)
            if all(f"{v.label}|{s}" in results["runs"] for v in variants(cfg))]


def _rows(cfg: ExperimentConfig, results: dict) -> dict[str, dict]:
    seeds = finished_seeds(cfg, results)
    if not seeds:
        raise PlasticError(f"no seed of the {cfg.experiment} experiment has finished every "
                           "variant yet; run it (again) to continue")
    out = {}
    for v in variants(cfg):
        runs = [results["runs"][f"{v.label}|{s}"] for s in seeds]
        out[v.label] = {"variant": v, "runs": runs,
                        "ci": pooled_bootstrap_ci([r["correct"] for r in runs],
                                                  groups_per_seed=[r["groups"] for r in runs])}
    return out


def accuracy_table(cfg: ExperimentConfig, results: dict) -> str:
    """Markdown: accuracy [95% CI], the paired difference to windowed FedAvg and its verdict,
    the aggregation drop over seeds, theta bytes, and the paper's figure."""
    rows = _rows(cfg, results)
    ref = rows["fedavg LoRA, window"]["runs"]
    n = len(ref[0]["correct"])
    chance = "25%" if cfg.experiment != "mmlu" else "25% (4 choices)"
    lines = [f"| {cfg.experiment}: variant | attention | accuracy [95% CI] | minus fedavg LoRA, "
             "window [paired 95% CI] | verdict | aggregation drop, pp [95% CI over seeds] | "
             "theta KB | paper |", "|---|---|---|---|---|---|---|---|"]
    for label, row in rows.items():
        v, runs = row["variant"], row["runs"]
        diff = pooled_bootstrap_ci([r["correct"] for r in runs],
                                   baseline_per_seed=[r["correct"] for r in ref],
                                   groups_per_seed=[r["groups"] for r in runs])
        drops = [r["drop"] for r in runs if "drop" in r]
        drop = format_ci(seed_ci(drops)) if drops else "-"
        same = label == "fedavg LoRA, window"
        lines.append(
            f"| {label} | {'full' if v.window == 0 else f'window {v.window}'} | "
            f"{format_ci(row['ci'])} | {'-' if same else format_ci(diff)} | "
            f"{'-' if same else verdict(diff)} | {drop} | {runs[0]['theta_bytes'] / 1e3:.1f} | "
            f"{PAPER_CELLS.get(cfg.experiment, {}).get(label, '-')} |")
    seeds = len(finished_seeds(cfg, results))
    lines.append(f"\n{seeds} seed(s) of {cfg.seeds} x {n} held-out items; chance {chance}; "
                 "intervals: "
                 "bootstrap over items clustered by entity/sample, pooled over seeds; "
                 f"{cfg.rounds} rounds x {cfg.local_steps} local steps, batch {cfg.batch_size}. "
                 "Paper (Qwen2.5-1.5B): "
                 + "; ".join(f"{k} {v}" for k, v in PAPER_CELLS.get(cfg.experiment, {}).items()))
    return "\n".join(lines)


def _plot_accuracy(cfg: ExperimentConfig, results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _rows(cfg, results)
    labels = list(rows)
    cis: list[CI] = [rows[k]["ci"] for k in labels]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar(range(len(labels)), [100 * c.mean for c in cis],
           yerr=[[100 * (c.mean - c.low) for c in cis], [100 * (c.high - c.mean) for c in cis]],
           capsize=4, color=["tab:green" if k.startswith("fednl") else "tab:gray"
                             for k in labels])
    ax.axhline(25, ls="--", color="k", lw=0.8, label="chance")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set(ylabel="accuracy (%)", title=f"FedNL {cfg.experiment}: "
           f"{len(finished_seeds(cfg, results))} seeds, 95% CI")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def stream_ce(model, tok, segments, bucket: int, window: int) -> list[float]:
    """Mean next-token cross-entropy per ``bucket`` tokens of one client stream (passages and
    answered questions, never reset), read with the model's window (0 = full attention)."""
    from plasticlm.eval import qa_line
    from plasticlm.memory import MemoryStream

    text = "\n".join(s.text if s.kind == "text" else qa_line(s.text, s.answer) for s in segments)
    ids = torch.tensor([[tok.bos_token_id, *tok(text, add_special_tokens=False)["input_ids"]]])
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
    from plasticlm.sandbox import resolve_data_spec
    from plasticlm.sandbox.tasks import load_client_streams

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
            print(f"[fednl experiment] stream {v.label}: last bucket "
                  f"{out['variants'][v.label]['last_bucket']['mean']:.3f}", flush=True)
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
    from plasticlm.data.corpus import load_text_corpus
    from plasticlm.sandbox import resolve_data_spec

    folder = resolve_data_spec(data)
    ids = tok("\n".join(d.text for d in load_text_corpus(folder / "corpus" / "valid.txt")),
              add_special_tokens=False)["input_ids"]
    return torch.tensor([(ids * (n // len(ids) + 1))[:n]])


@torch.no_grad()
def run_memory_experiment(cfg: ExperimentConfig, progress: bool = True) -> dict:
    """Bytes the receiver carries after T tokens of text: FedNL's memory stream (window
    ``cfg.window`` plus one delta-rule state per head) against a full-attention KV cache,
    both measured on the live objects, fed in 512-token chunks."""
    from transformers import DynamicCache

    from plasticlm.memory import MemoryStream

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
    for start in range(0, ids.shape[1], 512):
        chunk = ids[:, start:start + 512]
        positions = torch.arange(start, start + chunk.shape[1])[None]
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
                    "(float32); the paper reports no OOM at 16K tokens for FedNL."}
    root = Path(cfg.out) / "memory"
    root.mkdir(parents=True, exist_ok=True)
    (root / "results.json").write_text(json.dumps(out, indent=1) + "\n")
    (root / "table.md").write_text(out["table"] + "\n")
    _plot_memory(rows, root / "memory.png")
    return out


def _plot_memory(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def run_comm_experiment(cfg: ExperimentConfig, progress: bool = True) -> dict:
    """Bytes on the wire per round, like for like: FedNL's theta against LoRA-FedAvg at the
    same rank, LoRA-FedAvg at the rank whose adapter has FedNL's bytes, and full FedAvg; with
    the mmlu experiment's accuracies beside them when it has run."""
    fcfg = federated_config(dataclasses.replace(cfg, experiment="mmlu"),
                            Variant("fednl", "fednl", 64), 0, Path(cfg.out))
    clients = len(tasks_for(fcfg))

    def theta_bytes(method: MethodConfig) -> int:
        model, _ = build_model(dataclasses.replace(fcfg, method=method))
        return sum(x.numel() * 4 for x in get_theta(model).values())

    r = fcfg.method.lora_rank
    nl = theta_bytes(fcfg.method)
    lora_r = theta_bytes(MethodConfig(name="fedavg", window=64, lora_rank=r))
    per_rank = lora_r / r
    r_eq = max(1, round(nl / per_rank))
    rows = [(f"fednl (memory LoRA r{r} + beta + gate + conv)", nl),
            (f"fedavg LoRA r{r} (same rank)", lora_r),
            (f"fedavg LoRA r{r_eq} (FedNL's bytes)", round(per_rank * r_eq)),
            ("fedavg-full (every weight)", theta_bytes(MethodConfig(name="fedavg-full",
                                                                    window=64)))]
    acc = {}
    mmlu = Path(cfg.out) / "mmlu" / "results.json"
    if mmlu.exists():
        res = json.loads(mmlu.read_text())
        for label in ("fednl", "fedavg LoRA, window"):
            runs = [v for k, v in res["runs"].items() if k.startswith(label + "|")]
            if runs:
                acc[label] = seed_ci([x["accuracy"] for x in runs])
    lines = ["| theta | KB up per client | MB per round (all clients, up + down) | vs FedNL | "
             "mmlu accuracy [95% CI over seeds] |", "|---|---|---|---|---|"]
    for label, b in rows:
        key = "fednl" if label.startswith("fednl") else \
            "fedavg LoRA, window" if label.startswith(f"fedavg LoRA r{r} ") else None
        a = format_ci(acc[key]) if key in acc else "-"
        lines.append(f"| {label} | {b / 1e3:.1f} | {2 * clients * b / 1e6:.3f} | "
                     f"{b / nl:.2f}x | {a} |")
    out = {"config": dataclasses.asdict(cfg), "clients": clients,
           "bytes": dict(rows), "rank_for_equal_bytes": r_eq,
           "table": "\n".join(lines) + (
               f"\n\nfloat32, {clients} clients. Paper: FedNL 0.26 MB vs 22.5 MB for FedAvg's "
               "trainable adapter, i.e. 87x by its own figures (its text says 350x); a design "
               "ratio of adapter sizes, not of equal-rank LoRA.")}
    root = Path(cfg.out) / "comm"
    root.mkdir(parents=True, exist_ok=True)
    (root / "results.json").write_text(json.dumps(out, indent=1) + "\n")
    (root / "table.md").write_text(out["table"] + "\n")
    return out


def table_of_finished(cfg: ExperimentConfig) -> str:
    """The table of an accuracy experiment's finished seeds, without running anything."""
    path = Path(cfg.out) / cfg.experiment / "results.json"
    if cfg.experiment not in ("mmlu", "niah", "openbook") or not path.exists():
        raise PlasticError(f"no accuracy results at {path}")
    return accuracy_table(cfg, _load_results(path, cfg))


def run_experiment(cfg: ExperimentConfig, progress: bool = True) -> dict:
    """Run ``cfg.experiment``; returns its results (with a Markdown ``table``)."""
    if cfg.experiment in ("mmlu", "niah", "openbook"):
        return run_accuracy_experiment(cfg, progress)
    return {"stream": run_stream_experiment, "memory": run_memory_experiment,
            "comm": run_comm_experiment}[cfg.experiment](cfg, progress)
