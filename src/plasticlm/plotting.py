"""Matplotlib on its file-only Agg backend, set up once for every plot the package writes."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["interval_bars", "plt"]


def interval_bars(path: str | Path, title: str, rows: list[tuple[str, float, float, float]],
                  xlabel: str, chance: float | None = None) -> Path:
    """One horizontal bar per ``(label, mean, low, high)`` (in %) with its 95% interval as an
    error bar, a dashed line at ``chance``; sized to be read at 100% in a report page."""
    fig, ax = plt.subplots(figsize=(9.5, 0.55 * len(rows) + 1.4), dpi=100)
    labels = [r[0] for r in rows][::-1]
    means = [r[1] for r in rows][::-1]
    err = [[m - r[2] for m, r in zip(means, rows[::-1])],
           [r[3] - m for m, r in zip(means, rows[::-1])]]
    ax.barh(labels, means, xerr=err, color="#4c78a8", ecolor="#222", capsize=3)
    for y, (m, hi) in enumerate(zip(means, [r[3] for r in rows][::-1])):
        ax.text(hi + 1.5, y, f"{m:.1f}", va="center", fontsize=9)   # right of the interval
    if chance is not None:
        ax.axvline(chance, color="#999", linestyle="--", linewidth=1, label=f"chance {chance:.1f}%")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_xlim(0, 100)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
