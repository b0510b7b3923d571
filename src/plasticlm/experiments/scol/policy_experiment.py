"""``plasticlm scol experiment policy``: the walks that give the preference pairs, IPO on them
(:mod:`plasticlm.experiments.scol.choice_learning`) and the held-out comparisons.

Per seed, the oracle walks ``policy_train_contexts`` contexts of a colliding stream with LoRA
seed A, then the next ``eval_length`` contexts (held out) with seeds A (the oracle's pick,
committed) and B (scores every comparison). The action grammar allows at most
``oracle_layers`` layers, so every action a policy can name is a scored candidate and its
reward is read off the walk: the learned policy, the untrained one, the fixed last layer and
the layer that was best on the training contexts are compared at the same states with the same
LoRA noise.
"""

from __future__ import annotations

import copy
import itertools
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from plasticlm.eval import CI, paired_intervals, seed_ci, verdict
from plasticlm.experiments.scol.choice_learning import choices_of, train_ipo
from plasticlm.experiments.scol.oracle import (
    TIE,
    colliding_streams,
    margin_rows,
    pick_entropy_bits,
    run_stream,
)
from plasticlm.experiments.scol.plots import plot_policy_curve
from plasticlm.experiments.scol.setup import ExperimentConfig, load_model, replay_pool
from plasticlm.runs import RunDir
from plasticlm.scol.consolidate import num_layers_of
from plasticlm.scol.policy import LayerGrammar

KINDS = ("learned", "untrained", "last", "fixed", "random", "oracle")


def _series(records: list[dict], kind: str, curve: list[dict], fixed: tuple, part: str
            ) -> list[float]:
    """Per held-out context, LoRA seed B's loglik ``part`` of the candidate ``kind`` names:
    the learned (last curve point) or untrained (first point: theta_0 before IPO) policy's
    greedy action, the last layer, the fixed set, the oracle's pick (by seed A) or the mean
    of every set (random)."""
    out = []
    for r, mine, untrained in zip(records, curve[-1]["held_out_choices"],
                                  curve[0]["held_out_choices"]):
        sets = [tuple(c) for c in r["candidates"]]
        b = [x["loglik"][part] for x in r["rewards"]["B"]]
        pick = {"learned": tuple(mine), "untrained": tuple(untrained),
                "last": (max(max(c) for c in sets),), "fixed": tuple(fixed),
                "oracle": tuple(r["pick"])}.get(kind)
        out.append(sum(b[: r["n_sets"]]) / r["n_sets"] if pick is None else b[sets.index(pick)])
    return out


def best_on_train(train_records: list[list[dict]]) -> tuple[int, ...]:
    """The layer set with the best mean training reward (seed A) over every seed: the fixed
    choice a user would make from the training contexts, never from the held-out ones."""
    records = [r for rs in train_records for r in rs]
    sets = [tuple(c) for c in records[0]["candidates"][: records[0]["n_sets"]]]
    return max(sets, key=lambda s: sum(
        r["rewards"]["A"][[tuple(c) for c in r["candidates"]].index(s)]["loglik"]["total"]
        for r in records))


def summarise(train_records, held_records, curves) -> dict:
    """Margins of the learned policy over each comparison on the held-out contexts (seed B),
    paired on contexts, over seeds; the learning curve averaged over seeds."""
    fixed = best_on_train(train_records)
    out: dict = {"fixed_on_train": list(fixed), "margins": {}, "means": {}}
    for part in ("total", "acquisition", "forgetting"):
        series = {k: [_series(rs, k, c, fixed, part) for rs, c in zip(held_records, curves)]
                  for k in KINDS}
        out["means"][part] = {k: sum(map(sum, v)) / sum(map(len, v)) for k, v in series.items()}
        for a, b in [("learned", k) for k in KINDS[1:5]] + [("oracle", "learned")]:
            pooled, seeds = paired_intervals(series[a], series[b])
            out["margins"][f"{part}: {a} - {b}"] = {
                "pooled": asdict(pooled), "over_seeds": asdict(seeds),
                "verdict": verdict(pooled, part != "forgetting", seeds)}
    steps = [p["step"] for p in curves[0]]
    out["curve"] = [{"step": s, **{k: asdict(seed_ci([c[i][k] for c in curves]))
                                   for k in ("held_out_pair_accuracy", "train_pair_accuracy")}}
                    for i, s in enumerate(steps)]
    for name, point in (("learned_picks", -1), ("untrained_picks", 0)):
        picks = [tuple(x) for c in curves for x in c[point]["held_out_choices"]]
        out[name] = {",".join(map(str, k)): picks.count(k) for k in sorted(set(picks))}
    out["pairs_per_seed"] = [sum(len(c) for c in n) for n in
                             ([_pairs_of(r) for r in rs] for rs in train_records)]
    return out


def _pairs_of(record: dict) -> list:
    r = [x["loglik"]["total"] for x in record["rewards"]["A"][: record["n_sets"]]]
    return [p for p in itertools.combinations(r, 2) if abs(p[0] - p[1]) > TIE]


def policy_markdown(report: dict) -> str:
    """The learning curve, the held-out comparisons and what they mean for the claim."""
    s = report["summary"]
    lines = [f"IPO on exhaustive candidates: {report['train_contexts']} training and "
             f"{report['held_out_contexts']} held-out contexts per seed ({report['seeds']} "
             f"seeds; pairs per seed {s['pairs_per_seed']}); {report['steps']} IPO steps of "
             f"{report['batch_contexts']} contexts, lr {report['ipo_lr']}, tau "
             f"{report['ipo_tau']}. Rewards: loglik, nats/token x100, LoRA seed B on the "
             f"held-out contexts; fixed = the best layer on the training contexts "
             f"{s['fixed_on_train']}.", "",
             "| IPO step | held-out pair accuracy % [95% CI over seeds] | training pair "
             "accuracy % |", "|---|---|---|"]
    for p in s["curve"]:
        lines.append(f"| {p['step']} | {CI(**p['held_out_pair_accuracy']).format()} | "
                     f"{CI(**p['train_pair_accuracy']).format()} |")
    lines += ["", "| comparison (held out) | difference [95% CI] (seeds [lo, hi]) | verdict |",
              "|---|---|---|"]
    lines += margin_rows(s["margins"])
    lines += ["", "Means (held out, seed B, x100): " + "; ".join(
        f"{part}: " + ", ".join(f"{k} {100 * v:.2f}" for k, v in ms.items())
        for part, ms in s["means"].items()), "",
        f"Learned picks: {s['learned_picks']} (entropy "
        f"{pick_entropy_bits(s['learned_picks'].values()):.2f} bits); untrained picks: "
        f"{s['untrained_picks']} (entropy {pick_entropy_bits(s['untrained_picks'].values()):.2f}"
        " bits; one fixed answer: 0)."]
    return "\n".join(lines) + "\n"


# settings that leave the walks unchanged: the IPO recipe and its learning curve, and the
# number of seeds (seed s's stream and walks do not depend on how many others run, so more
# seeds reuse the earlier ones' walks)
_RECIPE_ONLY = ("policy_steps", "policy_batch_contexts", "policy_eval_every", "threads",
                "seeds")


def _walk_key(cfg: ExperimentConfig, seed: int) -> dict:
    key = json.loads(json.dumps(asdict(cfg)))
    for name in _RECIPE_ONLY:
        key.pop(name)
    key["scol"] = {k: v for k, v in key["scol"].items() if not k.startswith("ipo_")}
    return {**key, "walk_seed": seed}


def _walks(run: RunDir, seed: int, cfg, base, tok, train, held, replay, progress):
    """Seed ``seed``'s training and held-out walks, reused from ``seed-S/walks.json`` when
    they were made with the same settings (an IPO recipe can be re-run without them)."""
    path = run.path / f"seed-{seed}" / "walks.json"
    key = _walk_key(cfg, seed)
    if path.exists():
        stored = json.loads(path.read_text())
        if stored.get("key") == key:
            return stored["train"], stored["held_out"]
    tr = run_stream(base, tok, train, cfg, seed, replay, progress, ("A",), "pairs",
                    ("loglik",))
    he = run_stream(base, tok, held, cfg, seed + 10_000, replay, progress, ("A", "B"),
                    "held out", ("loglik",))
    RunDir(path.parent).write_json("walks.json", {"key": key, "train": tr, "held_out": he})
    return tr, he


def run_policy(cfg: ExperimentConfig, out: str | Path, progress: bool = True) -> dict:
    """The policy experiment over ``cfg.seeds`` seeds; writes ``policy.json`` (every
    candidate's rewards and every learning-curve point) and ``policy.md`` under ``out``."""
    run = RunDir(Path(out))
    cfg = replace(cfg, scol=replace(cfg.scol, max_layers=cfg.oracle_layers))
    run.write_json("config.json", cfg)
    started = time.time()
    base, tok = load_model(cfg)
    n = num_layers_of(base)
    grammar = LayerGrammar.for_model(base, tok, n, cfg.oracle_layers)
    replay = replay_pool(cfg, tok)
    walk = replace(cfg, eval_length=cfg.policy_train_contexts + cfg.eval_length)
    train_records, held_records, curves = [], [], []
    for i, (_, stream) in enumerate(colliding_streams(walk)):
        seed = cfg.seed + i
        train, held = stream[: cfg.policy_train_contexts], stream[cfg.policy_train_contexts:]
        tr, he = _walks(run, seed, cfg, base, tok, train, held, replay, progress)
        policy = copy.deepcopy(base)
        for p in policy.parameters():
            p.requires_grad_(True)
        torch.manual_seed(seed)
        curve = train_ipo(policy, base, tok, choices_of(tr, train, tok, grammar, n,
                                                        cfg.scol.prompt_chars),
                          choices_of(he, held, tok, grammar, n, cfg.scol.prompt_chars),
                          grammar, cfg, seed, progress)
        train_records.append(tr)
        held_records.append(he)
        curves.append(curve)
        run.write_json("progress.json", {"seeds_done": i + 1, "curves": curves})
        del policy
    report = {"seeds": cfg.seeds, "train_contexts": cfg.policy_train_contexts,
              "held_out_contexts": cfg.eval_length, "steps": cfg.policy_steps,
              "batch_contexts": cfg.policy_batch_contexts, "ipo_lr": cfg.scol.ipo_lr,
              "ipo_tau": cfg.scol.ipo_tau, "oracle_layers": cfg.oracle_layers,
              "lora": asdict(cfg.scol.lora),
              "summary": summarise(train_records, held_records, curves), "curves": curves,
              "train_records": train_records, "held_out_records": held_records,
              "seconds": round(time.time() - started, 1)}
    run.write_json("policy.json", report)
    (run.path / "policy.md").write_text(policy_markdown(report))
    plot_policy_curve(report, run.path)
    return report
