"""Summaries, comparison tables and plots of federated runs."""

from __future__ import annotations

from pathlib import Path

import torch

from plasticlm.plotting import plt

# The FedNL paper's reported figures (Qwen2.5-1.5B, non-IID MMLU, 5 domain clients). Its
# 22.5 MB is FedAvg's trainable adapter, not the whole model (a 1.5B model is >= 3 GB):
# 87x FedNL's 0.26 MB by its own figures, though its text says "about 350x".
# NIAH-7: mean exact match; streams: change of normalised CE over a 16K-token stream (%).
PAPER = {
    "mean_acc": {"fednl": 58.88, "fedssi": 58.70},
    "mb_per_round": {"fednl": 0.26, "fedavg": 22.5},
    "niah_acc": {"fednl": 29.7, "fedala": 28.6},
    "stream_ce_change": {"fednl": -2.1, "fedavg": 3.1},
}


def summarise(cfg, records: list[dict], theta: dict[str, torch.Tensor]) -> dict:
    """Final-round accuracy per client, mean, aggregation drop per domain, traffic."""
    last = records[-1]
    clients = last["clients"]
    rounds = len(records)
    up = sum(r.get("bytes_up", 0) for r in records)
    down = sum(r.get("bytes_down", 0) for r in records)
    return {
        "method": cfg.method.name,
        "split": cfg.data.split,
        "rounds": rounds,
        "theta_parameters": sum(v.numel() for v in theta.values()),
        "theta_bytes": sum(v.numel() * 4 for v in theta.values()),
        "mean_fed_acc": last["mean_fed_acc"],
        "mean_local_acc": sum(c["local_acc"] for c in clients.values()) / len(clients),
        "per_domain": {c["domain"]: {"fed_acc": c.get("fed_acc"), "local_acc": c["local_acc"],
                                     "drop": c.get("drop")} for c in clients.values()},
        "mean_drop": sum(c.get("drop", 0.0) for c in clients.values()) / len(clients),
        "mb_per_round": (up + down) / rounds / 1e6,
        # what one client uploads per round: the figure the paper's 0.26 vs 22.5 MB compares
        "mb_per_client_round": up / rounds / len(clients) / 1e6,
        "seconds": sum(r["seconds"] for r in records),
    }


def plot_run(records: list[dict], run_dir: Path) -> None:
    """accuracy.png (federated accuracy per round per domain) and bytes.png (MB per round)."""

    rounds = [r["round"] for r in records]
    domains = sorted({c["domain"] for r in records for c in r["clients"].values()})
    fig, ax = plt.subplots(figsize=(6, 4))
    for d in domains:
        ys = [next((c.get("fed_acc") for c in r["clients"].values() if c["domain"] == d), None)
              for r in records]
        ax.plot(rounds, ys, marker="o", label=d)
    ax.set(xlabel="round", ylabel="federated accuracy", title="accuracy per domain")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(run_dir / "accuracy.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([r - 0.2 for r in rounds], [r.get("bytes_up", 0) / 1e6 for r in records], 0.4,
           label="up")
    ax.bar([r + 0.2 for r in rounds], [r.get("bytes_down", 0) / 1e6 for r in records], 0.4,
           label="down")
    ax.set(xlabel="round", ylabel="MB", title="bytes on the wire per round")
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / "bytes.png", dpi=120)
    plt.close(fig)


def comparison_table(summaries: list[dict]) -> str:
    """A Markdown table: method, mean accuracy, aggregation drop per domain, MB per round."""
    domains = sorted({d for s in summaries for d in s["per_domain"]})
    # the paper's accuracy is MMLU's: beside MMLU-style clients only; a text file's clients
    # are scored by next-token accuracy
    text = all(s.get("split") == "iid" for s in summaries)
    head = (f"| method | {'next-token acc' if text else 'mean acc'} (%) | mean drop (pp) | "
            + " | ".join(f"drop {d} (pp)" for d in domains)
            + " | MB/round (all) | MB up/client/round | paper acc (%) | paper MB/round |")
    sep = "|" + "---|" * (7 + len(domains))
    rows = [head, sep]
    for s in summaries:
        drops = " | ".join(f"{100 * s['per_domain'][d]['drop']:+.1f}"
                           if s["per_domain"].get(d, {}).get("drop") is not None else "-"
                           for d in domains)
        pa = PAPER["mean_acc"].get(s["method"], "-") \
            if s.get("split", "domain") in ("domain", "dirichlet") else "-"
        pm = PAPER["mb_per_round"].get(s["method"], "-")
        rows.append(f"| {s['method']} | {100 * s['mean_fed_acc']:.1f} | "
                    f"{100 * s['mean_drop']:+.1f} | {drops} | {s['mb_per_round']:.3f} | "
                    f"{s['mb_per_client_round']:.4f} | {pa} | {pm} |")
    return "\n".join(rows)


# The paper's figures (PAPER; Qwen2.5-1.5B, its NIAH contexts far longer than ours,
# its MMLU accuracy including the base model's prior knowledge: neither comparable in level)
# as the cells of each experiment's table, by row label.
PAPER_CELLS = {
    "mmlu": {"fednl": f"{PAPER['mean_acc']['fednl']:.2f}",
             "fedssi": f"{PAPER['mean_acc']['fedssi']:.2f} (best baseline)"},
    "niah": {"fednl": f"{PAPER['niah_acc']['fednl']:.1f}",
             "fedala": f"{PAPER['niah_acc']['fedala']:.1f} (best baseline)"},
    "stream": {"fednl": f"{PAPER['stream_ce_change']['fednl']:+.1f}%",
               "fedavg LoRA, window": f"{PAPER['stream_ce_change']['fedavg']:+.1f}%"},
}
