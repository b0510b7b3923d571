"""The FedNL paper's experiments, each beside the controls a trivial system would need to beat.

``plasticlm fednl experiment NAME`` runs, for every seed, each variant of NAME as a real
Flower federation (:func:`plasticlm.fednl.run.run_federated`), then scores the final global
theta (each client with its own share of it where the method keeps one, as
``fednl-personal`` keeps its gate) item by item on every client's held-out data, so that
accuracies carry entity-clustered bootstrap intervals pooled over seeds and differences are
paired on the same items (:mod:`plasticlm.eval.stats`).

- ``mmlu``: closed-book, the five domain clients in the pre-training QA template.
- ``niah``: seven NIAH clients (one task each), needle far beyond a W-token window.
- ``openbook``: five domain clients; an unseen entity's passage, filler, then a question
  beyond the window; test items are about entities the client never trained on.
- ``stream``: the openbook (or niah) runs' thetas read each domain's client stream (2-4K
  tokens, one memory, never reset): cross-entropy per 256-token bucket, normalised by the
  first, and each in-stream question answered where it is asked (late vs early).
- ``memory``: bytes the receiver carries after T tokens, memory stream vs full KV cache.
- ``comm``: bytes per round like for like (equal LoRA rank, equal theta bytes, full model).

Every finished (variant, seed) is kept in ``results.json``; a re-run continues where it
stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from plasticlm.config import to_dict
from plasticlm.errors import PlasticError
from plasticlm.eval import (
    CI,
    format_ci,
    format_paired,
    paired_intervals,
    pooled_bootstrap_ci,
    seed_ci,
    verdict,
)
from plasticlm.experiments.fednl.communication import run_comm_experiment
from plasticlm.experiments.fednl.legacy import experiment_config
from plasticlm.experiments.fednl.paired_gaps import (
    baseline_gaps,
    central_gaps,
    lever_gaps,
    variants_of_fednl,
)
from plasticlm.experiments.fednl.streaming import run_memory_experiment, run_stream_experiment
from plasticlm.experiments.fednl.task_table import has_tasks, per_task_table
from plasticlm.experiments.fednl.variants import (
    CENTRAL,
    PAPER_BASELINES,
    ExperimentConfig,
    Variant,
    client_theta,
    federated_config,
    trained_model,
    variants,
)
from plasticlm.fednl.build import tasks_for
from plasticlm.fednl.clients import closed_book_test, has_closed_book_pool
from plasticlm.fednl.report import PAPER_CELLS
from plasticlm.fednl.theta import get_theta, set_theta
from plasticlm.models.specs import resolve_data
from plasticlm.outputs import prepare_output
from plasticlm.plotting import plt

log = logging.getLogger("plasticlm.fednl")


def _score(cfg: ExperimentConfig, v: Variant, seed: int, root: Path, progress: bool) -> dict:
    t0 = time.time()
    fcfg = federated_config(cfg, v, seed, root)
    model, tok, summary = trained_model(fcfg, v.trained, progress, central=v.central)
    global_theta = get_theta(model)
    correct, groups, per_client = [], [], {}
    for pid, task in enumerate(tasks_for(fcfg)):
        if v.trained and not v.central:  # each client answers with its own share, if any
            set_theta(model, client_theta(fcfg, pid, global_theta))
        c = task.correct(model, tok)
        per_client[task.name] = sum(c) / len(c)
        correct += c
        groups += [f"{task.name}/{g}" for g in task.groups()]
    out = {"correct": correct, "groups": groups, "per_client": per_client,
           "accuracy": sum(correct) / len(correct), "seconds": round(time.time() - t0, 1),
           "theta_bytes": sum(x.numel() * 4 for x in global_theta.values())}
    if cfg.experiment in ("niah", "openbook") and has_closed_book_pool(fcfg.data.source):
        set_theta(model, global_theta)
        book = closed_book_test(resolve_data(fcfg.data.source))
        out.update(closed_book=book.correct(model, tok), closed_book_groups=book.groups())
    if summary and v.central:
        out.update(central_steps=summary["central_steps"],
                   train_seconds=round(summary["seconds"], 1))
    elif summary:
        out.update(drop=summary["mean_drop"], mb_per_round=summary["mb_per_round"],
                   train_seconds=round(summary["seconds"], 1))
    return out


def _load_results(path: Path, cfg: ExperimentConfig) -> dict:
    """The runs scored so far under ``cfg`` (none when the folder's were scored under another
    config). Which rows and how many seeds run does not decide it: each scored run is
    keyed by its row and seed, and neither depends on the others, so more rows or seeds
    score only what is new."""
    if path.exists():
        saved = json.loads(path.read_text())
        # read back through the config: results written before a field existed still match
        # while the new field holds its default (and flat configs of earlier versions read)
        try:
            same = dataclasses.replace(experiment_config(saved.get("config", {})),
                                       rows=cfg.rows, seeds=cfg.seeds) == cfg
        except PlasticError:
            same = False
        if same:
            return {**saved, "config": to_dict(cfg)}
    return {"config": to_dict(cfg), "runs": {}}


def run_accuracy_experiment(cfg: ExperimentConfig, progress: bool = True) -> dict:
    """mmlu / niah / openbook: every variant x seed, scored per item; returns the results."""
    root = prepare_output(Path(cfg.out) / cfg.experiment, "experiment",
                          hint="choose another --set out=...")
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
                log.info("experiment %s, seed %d, %s: %.1f%% (%.0f s)", cfg.experiment, seed,
                         v.label, 100 * r["accuracy"], r["seconds"])
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
    book = any("closed_book" in r for row in rows.values() for r in row["runs"])
    lines = [f"| {cfg.experiment}: variant | attention | accuracy [95% CI] | minus fedavg LoRA, "
             "window [paired 95% CI] (seeds [95% CI of the seeds' differences]) | verdict | "
             "aggregation drop, pp [95% CI over seeds] | theta KB | paper |"
             + (" closed-book [95% CI] |" if book else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if book else "")]
    for label, row in rows.items():
        v, runs = row["variant"], row["runs"]
        diff, over_seeds = paired_intervals([r["correct"] for r in runs],
                                            [r["correct"] for r in ref],
                                            [r["groups"] for r in runs])
        drops = [r["drop"] for r in runs if "drop" in r]
        drop = format_ci(seed_ci(drops)) if drops else "-"
        same = label == "fedavg LoRA, window"
        lines.append(
            f"| {label} | {'full' if v.window == 0 else f'window {v.window}'} | "
            f"{format_ci(row['ci'])} | {'-' if same else format_paired(diff, over_seeds)} | "
            f"{'-' if same else verdict(diff, over_seeds=over_seeds)} | {drop} | "
            f"{runs[0]['theta_bytes'] / 1e3:.1f} | "
            f"{PAPER_CELLS.get(cfg.experiment, {}).get(label, '-')} |"
            + (f" {_closed_book_cell(runs)} |" if book else ""))
    seeds = len(finished_seeds(cfg, results))
    lines.append(f"\n{seeds} seed(s) of {cfg.seeds} x {n} held-out items; chance {chance}; "
                 "intervals: "
                 "bootstrap over items clustered by entity/sample, pooled over seeds; the "
                 "difference also as the t-interval of the seeds' paired differences, and "
                 "'better'/'worse' only when both exclude 0; "
                 f"{cfg.run.train.rounds} rounds x {cfg.run.train.local_steps} local steps, "
                 f"batch {cfg.run.train.batch_size}. "
                 "Paper (Qwen2.5-1.5B): "
                 + "; ".join(f"{k} {v}" for k, v in PAPER_CELLS.get(cfg.experiment, {}).items())
                 + (". Closed-book: the held-out closed-book questions (no context) asked of "
                    "each row's final model at its own window, what learning to read far back "
                    "leaves of the short-context skill; bootstrap over questions ('-': runs "
                    "scored before the column existed)" if book else ""))
    if CENTRAL in rows:
        lines += ["", central_gaps(rows)]
    if "fednl" in rows and any(b in rows for b in PAPER_BASELINES):
        lines += ["", baseline_gaps(rows)]
    if "fednl" in rows and variants_of_fednl(rows):
        lines += ["", lever_gaps(rows)]
    if cfg.experiment == "niah" and all(has_tasks(row["runs"]) for row in rows.values()):
        lines += ["", "Per task (the paper's NIAH-7 table has a column per task):", "",
                  per_task_table(rows)]
    return "\n".join(lines)


def _closed_book_cell(runs: list[dict]) -> str:
    if not all("closed_book" in r for r in runs):
        return "-"
    return format_ci(pooled_bootstrap_ci([r["closed_book"] for r in runs],
                                         groups_per_seed=[r["closed_book_groups"] for r in runs]))


def _plot_accuracy(cfg: ExperimentConfig, results: dict, path: Path) -> None:
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
