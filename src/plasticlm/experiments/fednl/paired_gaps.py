"""The lines under an accuracy table that pair one row with another on the same items: each
federated FedNL row minus the central pooled yardstick, FedNL minus each of the paper's
baselines, and each FedNL variant (a lever, an ablation) minus FedNL itself.

``rows`` maps a row's label to ``{"variant": Variant, "runs": [per-seed scored run]}``
(:func:`plasticlm.experiments.fednl.experiment._rows`); every difference carries the pooled item interval,
the t-interval of the seeds' differences and the verdict (:mod:`plasticlm.eval.stats`).
"""

from __future__ import annotations

from plasticlm.eval import format_paired, paired_intervals, verdict
from plasticlm.experiments.fednl.variants import CENTRAL, PAPER_BASELINES


def gap_cell(label: str, runs: list[dict], reference: list[dict]) -> str:
    """``label``, then ``runs`` minus ``reference`` paired on the same items, with the seeds'
    interval and the verdict."""
    diff, over_seeds = paired_intervals([r["correct"] for r in runs],
                                        [r["correct"] for r in reference],
                                        [r["groups"] for r in runs])
    return f"{label} {format_paired(diff, over_seeds)}, {verdict(diff, over_seeds=over_seeds)}"


def central_gaps(rows: dict[str, dict]) -> str:
    """One line: each trained federated FedNL row minus the central pooled yardstick, paired
    on the same items (issue 41 asks for federated within 5 pp of central)."""
    central = rows[CENTRAL]["runs"]
    federated = (["fednl"] if "fednl" in rows else []) + variants_of_fednl(rows)
    cells = [gap_cell(label, rows[label]["runs"], central) for label in federated]
    steps = central[0].get("central_steps", "?")
    return (f"Federated minus '{CENTRAL}' ({steps} steps, the federation's total, on the "
            "clients' data pooled), pp paired on the same items (seeds): " + "; ".join(cells)
            + ".")


def baseline_gaps(rows: dict[str, dict]) -> str:
    """One line: FedNL minus each of the paper's baselines that ran, paired on the same items
    (the paper's own comparison: FedNL against its best baseline)."""
    fednl = rows["fednl"]["runs"]
    cells = [gap_cell(b, fednl, rows[b]["runs"]) for b in PAPER_BASELINES if b in rows]
    return ("FedNL minus each of the paper's baselines, pp paired on the same items (seeds): "
            + "; ".join(cells) + ".")


def variants_of_fednl(rows: dict[str, dict]) -> list[str]:
    """The trained federated rows that change one thing of FedNL (a lever or an ablation)."""
    return [label for label, row in rows.items()
            if label.startswith("fednl, ") and row["variant"].trained
            and not row["variant"].central]


def lever_gaps(rows: dict[str, dict]) -> str:
    """One line: each FedNL variant (a lever, an ablation) minus FedNL itself, paired on the
    same items: what the one change moved."""
    fednl = rows["fednl"]["runs"]
    cells = [gap_cell(label, rows[label]["runs"], fednl) for label in variants_of_fednl(rows)]
    return ("Each FedNL variant minus 'fednl' (what its one change moved), pp paired on the "
            "same items (seeds): " + "; ".join(cells) + ".")
