"""SCoL's figures: the accuracy matrices, the summary bars beside the paper, the layer
histogram, the Fisher plot and the policy's learning curve."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from plasticlm.experiments.scol.report import PAPER, from_policy
from plasticlm.plotting import plt


def plot_squad(report: dict, out: Path) -> None:
    """``matrices.png`` (one EM matrix per method), ``summary.png`` (bars vs the paper) and
    ``layers.png`` (histogram of selected layers)."""

    methods = list(report["methods"])
    fig, axes = plt.subplots(1, len(methods), figsize=(3 * len(methods), 3), squeeze=False)
    for ax, name in zip(axes[0], methods):
        m = report["methods"][name]["matrix_em"]
        n = len(m)
        grid = np.full((n, n), np.nan)
        for r, row in enumerate(m):
            grid[r, : len(row)] = row
        ax.imshow(grid, vmin=0, vmax=1, cmap="viridis")
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("context")
        ax.set_ylabel("after commit")
    fig.tight_layout()
    fig.savefig(out / "matrices.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 3.5))
    x = np.arange(len(methods))
    imm = [report["methods"][k]["em"]["immediate"] or 0 for k in methods]
    ret = [report["methods"][k]["em"]["retention"] or 0 for k in methods]
    pimm = [PAPER.get(k, {}).get("immediate", np.nan) for k in methods]
    pret = [PAPER.get(k, {}).get("retention", np.nan) for k in methods]
    ax.bar(x - 0.3, imm, 0.2, label="immediate (here)")
    ax.bar(x - 0.1, ret, 0.2, label="retention (here)")
    ax.bar(x + 0.1, pimm, 0.2, label="immediate (paper)", alpha=0.5)
    ax.bar(x + 0.3, pret, 0.2, label="retention (paper)", alpha=0.5)
    ax.set_xticks(x, methods, rotation=20, fontsize=8)
    ax.set_ylabel("exact match")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "summary.png", dpi=100)
    plt.close(fig)

    hist = {k: v["layer_histogram"] for k, v in report["methods"].items()
            if "layer_histogram" in v and from_policy(k)}
    if hist:
        fig, ax = plt.subplots(figsize=(5, 3))
        width = 0.8 / len(hist)
        for j, (k, h) in enumerate(hist.items()):
            ax.bar(np.arange(len(h)) + j * width, h, width, label=k)
        ax.set_xlabel("layer")
        ax.set_ylabel("times selected")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "layers.png", dpi=100)
        plt.close(fig)


def plot_fisher(report: dict, out: Path) -> None:

    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    n = len(report["mean_fisher"])
    axes[0].bar(range(n), report["mean_fisher"])
    axes[0].set_title("mean empirical Fisher per layer", fontsize=9)
    axes[0].set_xlabel("layer")
    axes[1].bar(range(n), report["layer_histogram"])
    axes[1].set_title("policy selections per layer", fontsize=9)
    axes[1].set_xlabel("layer")
    fig.tight_layout()
    fig.savefig(out / "fisher.png", dpi=100)
    plt.close(fig)


def plot_policy_curve(report: dict, out: Path) -> None:
    """``policy_curve.png``: held-out and training pair accuracy (mean over seeds, 95%
    band) against IPO steps, beside chance (50%)."""
    curve = report["summary"]["curve"]
    steps = [p["step"] for p in curve]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for key, label in (("held_out_pair_accuracy", "held-out pairs"),
                       ("train_pair_accuracy", "training pairs")):
        mean = [100 * p[key]["mean"] for p in curve]
        ax.plot(steps, mean, marker="o", label=label)
        ax.fill_between(steps, [100 * p[key]["low"] for p in curve],
                        [100 * p[key]["high"] for p in curve], alpha=0.2)
    ax.axhline(50, color="grey", linestyle=":", label="chance")
    ax.set_xlabel("IPO step")
    ax.set_ylabel("pair accuracy (%)")
    ax.set_title(f"SCoL policy, {report['seeds']} seeds", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "policy_curve.png", dpi=100)
    plt.close(fig)
