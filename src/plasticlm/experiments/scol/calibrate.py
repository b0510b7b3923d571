"""Before any policy experiment: calibrate the inner update, and ask whether there is a
choice to learn.

``plasticlm scol experiment sweep``: calibrate the inner update.

Every setting of a grid (target modules x steps x learning rate x rank, with and without
generic replay) consolidates the same evaluation stream, one commit per context, each on
random layers of the sizes a policy names (1 to ``max_layers``, drawn by seed, identical for
every setting), or the last layer for every context (``layers = "last"``). Measured per
setting: acquisition (EM on a context's questions right after its commit, the diagonal),
retention (EM on every earlier context after the whole stream), the same two by closed-set
multiple choice (the attribute's legal values ranked by log-likelihood: a fact written into
the weights that greedy decoding does not yet produce), and the legal-answer rate after the
whole stream, beside the untouched model's. The recommended default is the setting with the
best acquisition among those that keep the legal-answer rate at >= ``keep_legal`` of the
untouched model's.

``plasticlm scol experiment gate``: the oracle gate. Every action (each single layer, and
each pair with ``max_layers`` = 2) updates the untouched model on each context of the
evaluation stream; the reward is the QA score on that context's questions. The oracle (the
best action per context, in hindsight) must beat the best constant action by ``gate_pp``,
otherwise a policy has nothing to learn in this world. Picking the per-context maximum of
noisy scores flatters the oracle, so the gate also reports it cross-fitted: the action is
picked with one LoRA seed and scored with another.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Literal

from tqdm.auto import tqdm

from plasticlm.config import Field, configclass, override
from plasticlm.data.squad import load_squad
from plasticlm.experiments.scol.setup import legal_sets, load_model, replay_pool, resolve_world_file
from plasticlm.scol.consolidate import (
    MODULES,
    LoraTrainConfig,
    Unit,
    adapt_lora,
    context_windows,
    num_layers_of,
    pad_of,
    with_replay,
)
from plasticlm.scol.contexts import contexts_from_passages, split_streams
from plasticlm.scol.matrix import AccuracyMatrix
from plasticlm.scol.rewards import qa_accuracy

log = logging.getLogger("plasticlm.scol")


@configclass
class SweepConfig:
    """The grid; every combination runs."""

    modules: tuple[Unit, ...] = Field(("attention", "mlp", "all"), min_length=1,
                                      description="units LoRA adapts (scol.lora's "
                                      "target_modules by unit)")
    steps: tuple[Annotated[int, Field(ge=1)], ...] = Field(
        (4, 12), min_length=1, description="inner-update steps per context")
    lr: tuple[Annotated[float, Field(gt=0)], ...] = Field(
        (1e-3, 3e-3), min_length=1, description="inner-update learning rates")
    rank: tuple[Annotated[int, Field(ge=1)], ...] = Field((8,), min_length=1,
                                                         description="LoRA ranks (alpha = 2 "
                                                         "x rank)")
    replay: tuple[Annotated[int, Field(ge=0)], ...] = Field(
        (0, 4), min_length=1, description="generic-text windows replayed per update")
    max_layers: int = Field(2, ge=1, description="random layers: at most this many per "
                            "context")
    layers: Literal["random", "last"] = Field(
        "random", description="random (1..max_layers per context, drawn by seed) or last "
        "(the last layer for every context)")
    keep_legal: float = Field(0.9, ge=0, le=1, description="a setting must keep this share "
                              "of the untouched model's legal-answer rate")
    seed: int = Field(0, ge=0, description="seed of the layer draws and the LoRA updates")

    def settings(self) -> list[dict]:
        return [{"modules": m, "steps": s, "lr": lr, "rank": r, "replay": rp}
                for m, s, lr, r, rp in itertools.product(self.modules, self.steps, self.lr,
                                                        self.rank, self.replay)]


@dataclass
class SweepResult:
    setting: dict
    immediate: float
    retention: float
    legal_final: float
    seconds: float
    layers: list[list[int]] = field(default_factory=list)
    immediate_mc: float | None = None     # closed-set MC right after each commit
    retention_mc: float | None = None     # closed-set MC on earlier contexts, end of stream


def lora_config(base: LoraTrainConfig, setting: dict) -> LoraTrainConfig:
    """``base`` with one grid setting applied."""
    return replace(base, target_modules=MODULES[setting["modules"]], steps=setting["steps"],
                   lr=setting["lr"], rank=setting["rank"], alpha=2.0 * setting["rank"],
                   replay=setting["replay"])


def evaluation_stream(cfg):
    """``(untouched model, tokenizer, evaluation stream)`` of an experiment config: the
    same stream the squad experiment evaluates on (legal value sets attached)."""
    base, tok = load_model(cfg)
    contexts = contexts_from_passages(load_squad(resolve_world_file(cfg, "squad")),
                                      legal_sets(cfg))
    _, stream = split_streams(contexts, cfg.train_streams, cfg.stream_length, cfg.eval_length,
                              cfg.seed)
    return base, tok, stream


def run_setting(base_model, tokenizer, stream, lora: LoraTrainConfig, layer_sets, replay,
                seed: int = 0) -> SweepResult:
    """Consolidate ``stream`` with ``lora`` on ``layer_sets`` (one per context)."""
    t0 = time.time()
    model = copy.deepcopy(base_model)
    mat = AccuracyMatrix(stream)
    for t, (ctx, layers) in enumerate(zip(stream, layer_sets)):
        windows = with_replay(context_windows(tokenizer, ctx.text, lora.max_tokens), replay,
                              lora.replay, pad_of(tokenizer), seed * 100_003 + t)
        model, _ = adapt_lora(model, layers, windows, lora, seed * 100_003 + t)
        mat.add_row(model, tokenizer, t, full=False)     # the last row is full
    s = mat.summary()
    return SweepResult({}, s["em"]["immediate"], s["em"]["retention"] or 0.0,
                       mat.legal[-1] or 0.0, round(time.time() - t0, 1),
                       [list(x) for x in layer_sets], s["mc"]["immediate"], s["mc"]["retention"])


def run_sweep(cfg, sweep: SweepConfig, out: str | Path, progress: bool = True) -> dict:
    """The sweep on ``cfg``'s model and evaluation stream (a
    :class:`plasticlm.experiments.scol.experiment.ExperimentConfig`); writes ``sweep.json`` and
    ``sweep.md`` under ``out`` and returns the report."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base, tok, stream = evaluation_stream(cfg)
    n = num_layers_of(base)
    rng = random.Random(sweep.seed)
    layer_sets = ([tuple(sorted(rng.sample(range(n), rng.randint(1, sweep.max_layers))))
                   for _ in stream] if sweep.layers == "random" else [(n - 1,)] * len(stream))
    untouched = AccuracyMatrix(stream)
    untouched.add_row(base, tok, len(stream) - 1)
    base_legal = untouched.legal[-1] or 0.0
    base_summary = untouched.summary()
    pool = replay_pool(override(cfg, {"scol.lora.replay": max(sweep.replay)}), tok)
    results = []
    for setting in tqdm(sweep.settings(), desc="inner-update sweep", disable=not progress):
        r = run_setting(base, tok, stream, lora_config(cfg.scol.lora, setting), layer_sets,
                        pool, sweep.seed)
        r.setting = setting
        results.append(r)
        if progress:
            log.info("sweep %s: immediate %.1f%% (MC %.1f%%), retention %.1f%% (MC %.1f%%), "
                     "legal %.0f%% (untouched %.0f%%)", setting, 100 * r.immediate,
                     100 * (r.immediate_mc or 0), 100 * r.retention, 100 * (r.retention_mc or 0),
                     100 * r.legal_final, 100 * base_legal)
    ok = [r for r in results if r.legal_final >= sweep.keep_legal * base_legal]
    best = max(ok, key=lambda r: (r.immediate, r.retention)) if ok else None
    report = {"sweep": asdict(sweep), "contexts": len(stream), "layer_sets": layer_sets,
              "untouched": {"legal": base_legal, "em": base_summary["em"]["final_all"],
                            "mc": base_summary["mc"]["final_all"],
                            "mc_chance": untouched.mc_chance},
              "results": [asdict(r) for r in results],
              "recommended": best.setting if best else None}
    (out / "sweep.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "sweep.md").write_text(sweep_markdown(report))
    return report


def sweep_markdown(report: dict) -> str:
    """The sweep as a table, the kept settings marked, the recommended one named."""
    keep = report["sweep"]["keep_legal"] * report["untouched"]["legal"]
    u = report["untouched"]
    where = (f"random layers of 1..{report['sweep']['max_layers']} per context, the same for "
             "every setting" if report["sweep"].get("layers", "random") == "random"
             else "the last layer for every context")
    lines = [f"Inner-update sweep on {report['contexts']} evaluation contexts ({where}). "
             f"Untouched model: legal answers {100 * u['legal']:.0f}%, EM "
             f"{100 * (u['em'] or 0):.1f}%" + (
                 f", closed-set MC {100 * u['mc']:.1f}% (chance {100 * u['mc_chance']:.1f}%)"
                 if u.get("mc") is not None else "") + ".", "",
             "| modules | steps | lr | rank | replay | immediate EM | retention EM | "
             "immediate MC | retention MC | legal answers after the stream | kept |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def pct(x) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"
    for r in report["results"]:
        s = r["setting"]
        lines.append(f"| {s['modules']} | {s['steps']} | {s['lr']:g} | {s['rank']} | "
                     f"{s['replay']} | {pct(r['immediate'])} | {pct(r['retention'])} | "
                     f"{pct(r.get('immediate_mc'))} | {pct(r.get('retention_mc'))} "
                     f"| {100 * r['legal_final']:.0f}% | "
                     f"{'yes' if r['legal_final'] >= keep else 'no'} |")
    rec = report["recommended"]
    lines += ["", f"Recommended (best immediate EM among settings that keep >= "
              f"{100 * report['sweep']['keep_legal']:.0f}% of the untouched legal rate): "
              + (json.dumps(rec) if rec else "none: every setting damages the model")]
    return "\n".join(lines) + "\n"


GATE_PP = 5.0


def oracle_gate(cfg, out: str | Path, max_layers: int = 1, progress: bool = True) -> dict:
    """The oracle gate on ``cfg``'s evaluation stream (see the module docstring); writes
    ``gate.json`` and ``gate.md`` under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base, tok, stream = evaluation_stream(cfg)
    n = num_layers_of(base)
    actions = [a for k in range(1, max_layers + 1) for a in itertools.combinations(range(n), k)]
    pool = replay_pool(cfg, tok)
    metric = cfg.scol.qa_metric
    scores = {0: [], 1: []}    # LoRA seed -> [context][action]
    bar = tqdm(total=2 * len(stream) * len(actions), desc="oracle gate", disable=not progress)
    for t, ctx in enumerate(stream):
        own = context_windows(tok, ctx.text, cfg.scol.lora.max_tokens)
        for lora_seed in scores:
            seed = lora_seed * 1_000_003 + t
            windows = with_replay(own, pool, cfg.scol.lora.replay, pad_of(tok), seed)
            row = []
            for a in actions:
                adapted, _ = adapt_lora(base, a, windows, cfg.scol.lora, seed)
                row.append(qa_accuracy(adapted, tok, ctx.questions, metric))
                bar.update()
            scores[lora_seed].append(row)
    bar.close()
    s0, s1 = scores[0], scores[1]

    def mean(xs):
        return sum(xs) / len(xs)

    constant = [mean([row[j] for row in s0]) for j in range(len(actions))]
    best_j = max(range(len(actions)), key=constant.__getitem__)
    oracle = mean([max(row) for row in s0])
    picks = [max(range(len(actions)), key=row.__getitem__) for row in s0]
    cross = mean([s1[t][j] for t, j in enumerate(picks)])
    constant_cross = mean([row[best_j] for row in s1])
    report = {"metric": metric, "contexts": len(stream), "actions": [list(a) for a in actions],
              "scores": {str(k): v for k, v in scores.items()},
              "best_constant": {"action": list(actions[best_j]), "score": constant[best_j],
                                "cross_fitted": constant_cross},
              "oracle": oracle, "oracle_cross_fitted": cross,
              "gap_pp": 100 * (oracle - constant[best_j]),
              "gap_cross_fitted_pp": 100 * (cross - constant_cross), "threshold_pp": GATE_PP}
    report["passes"] = report["gap_cross_fitted_pp"] >= GATE_PP
    (out / "gate.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "gate.md").write_text(gate_markdown(report))
    return report


def gate_markdown(report: dict) -> str:
    """The gate's verdict and numbers."""
    b = report["best_constant"]
    verdict = ("passes: a per-context choice has room to beat a fixed one" if report["passes"]
               else "**fails: the policy has nothing to learn in this world** (the best "
               "per-context choice does not beat the best fixed choice by the threshold)")
    return (f"Oracle gate ({report['contexts']} contexts, {len(report['actions'])} actions, "
            f"{report['metric']} on each context's questions after updating the untouched "
            f"model): best constant action {b['action']} {100 * b['score']:.1f}%, oracle "
            f"(best per context, hindsight) {100 * report['oracle']:.1f}% (gap "
            f"{report['gap_pp']:+.1f} pp); cross-fitted (picked with LoRA seed 0, scored with "
            f"seed 1): constant {100 * b['cross_fitted']:.1f}%, oracle "
            f"{100 * report['oracle_cross_fitted']:.1f}% (gap "
            f"{report['gap_cross_fitted_pp']:+.1f} pp, threshold "
            f"{report['threshold_pp']:.0f} pp): {verdict}.\n")
