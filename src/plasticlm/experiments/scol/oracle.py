"""``plasticlm scol experiment oracle``: does the layer choice matter on a stream whose facts
collide, and by how much could a perfect choice beat the fixed last layer, the untrained
policy and a random choice? If that margin is not clearly above zero, no policy can be shown
to learn anything on the stream.

Each seed's stream holds ``eval_length`` contexts of one domain of the world (the same
relations about similar entities: "Which organ does X act on?" for every X), so an update
for one context can overwrite what earlier ones wrote. At every context, from the model the
oracle has committed so far, every layer set of 1..``oracle_layers`` layers (and the
untrained policy's greedy action, the running model being the policy) is adapted twice,
with two LoRA seeds (A and B), and scored by the ``loglik`` reward (the gold answers'
log-likelihood gain minus its loss on earlier contexts' questions) and by the 0/1 QA reward
(``supervised``). The oracle picks by A and is scored by B (cross-fitted: a maximum over
noisy candidates is not scored on its own noise); A's pick is committed.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections import Counter, defaultdict
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from plasticlm.data.squad import load_squad
from plasticlm.errors import PlasticError
from plasticlm.eval import CI, format_paired, paired_intervals, verdict
from plasticlm.experiments.scol.setup import (
    ExperimentConfig,
    legal_sets,
    load_model,
    replay_pool,
    resolve_world_file,
    swap_names,
)
from plasticlm.runs import RunDir
from plasticlm.scol.candidates import adapt_lora_together
from plasticlm.scol.consolidate import context_windows, num_layers_of, pad_of, with_replay
from plasticlm.scol.contexts import contexts_from_passages
from plasticlm.scol.policy import LayerGrammar, action_prompt, sample_actions
from plasticlm.scol.records import Context
from plasticlm.scol.rewards import reward_probe

TIE = 1e-9   # rewards closer than this tie


def domain_of(passage) -> str:
    """The world's domain of a passage (question ids are ``domain.split.n.attribute``); a
    file without such ids is one domain."""
    qid = passage.qas[0].id if passage.qas else ""
    return qid.split(".")[0] if "." in qid else "all"


def colliding_streams(cfg: ExperimentConfig) -> list[tuple[str, list[Context]]]:
    """Per seed, ``(domain, eval_length contexts)``: seed ``s`` takes the world's domains in
    turn; its stream is that domain's contexts (shuffled by ``s``), then, only where the
    domain has too few (a tiny world), the other domains' in order."""
    passages = load_squad(resolve_world_file(cfg, "squad"))
    by_domain: dict[str, list] = defaultdict(list)
    for p in passages:
        if p.qas:
            by_domain[domain_of(p)].append(p)
    domains = sorted(by_domain)
    if sum(map(len, by_domain.values())) < cfg.eval_length:
        raise PlasticError(f"eval_length {cfg.eval_length} needs more passages with questions "
                           f"than the {sum(map(len, by_domain.values()))} there are")
    legal, swap = legal_sets(cfg), swap_names(cfg)
    out = []
    for i in range(cfg.seeds):
        seed = cfg.seed + i
        first = seed % len(domains)
        pool = []
        for d in domains[first:] + domains[:first]:
            group = list(by_domain[d])
            random.Random(seed).shuffle(group)
            pool += group
        out.append((domains[first], contexts_from_passages(pool[: cfg.eval_length], legal,
                                                           swap)))
    return out


def pick_entropy_bits(counts) -> float:
    """Entropy in bits of the choices counted in ``counts`` (0: one fixed answer)."""
    counts = [c for c in counts if c]
    total = sum(counts)
    return abs(sum(c / total * math.log2(c / total) for c in counts))


def layer_sets(num_layers: int, most: int) -> list[tuple[int, ...]]:
    """Every set of 1..``most`` layers, smallest first."""
    return [s for k in range(1, most + 1) for s in itertools.combinations(range(num_layers), k)]


def _score(model, tok, stream, t, cfg, adapted_models,
           rewards: tuple[str, ...] = ("loglik", "supervised")) -> list[dict]:
    """The ``rewards`` of every adapted candidate at context ``t``."""
    probes = {name: reward_probe(model, tok, stream, t, replace(cfg.scol, reward=name))
              for name in rewards}
    return [{name: asdict(probe(m)) for name, probe in probes.items()} for m in adapted_models]


def run_stream(base, tok, stream: list[Context], cfg: ExperimentConfig, seed: int, replay,
               progress: bool = True, names: tuple[str, ...] = ("A", "B"),
               desc: str = "oracle", rewards: tuple[str, ...] = ("loglik", "supervised")
               ) -> list[dict]:
    """The oracle's walk over one stream; one record per context. Every candidate is adapted
    once per LoRA seed in ``names`` (A, then B) and scored by ``rewards`` (loglik first);
    the first seed's best by loglik is committed."""
    model = base
    n = num_layers_of(base)
    sets = layer_sets(n, cfg.oracle_layers)
    grammar = LayerGrammar.for_model(base, tok, n, cfg.scol.max_layers)
    gen = torch.Generator().manual_seed(seed)
    records = []
    seeds = {"A": 0, "B": 50_000}
    for t in tqdm(range(len(stream)), desc=f"{desc}, seed {seed}", disable=not progress,
                  leave=False):
        t0 = time.time()
        ctx = stream[t]
        prompt = action_prompt(ctx.text, n, cfg.scol.prompt_chars)
        policy = sample_actions(model, tok, prompt, grammar, 1, 0.0, gen)[0].layers
        candidates = sets + ([policy] if policy not in sets else [])
        own = context_windows(tok, ctx.text, cfg.scol.lora.max_tokens)
        scored = {}
        for name in names:
            lora_seed = seed * 100_003 + t + seeds[name]
            windows = with_replay(own, replay, cfg.scol.lora.replay, pad_of(tok), lora_seed)
            adapted, _ = adapt_lora_together(model, candidates, windows, cfg.scol.lora,
                                             [lora_seed + i for i in range(len(candidates))])
            scored[name] = _score(model, tok, stream, t, cfg, adapted, rewards)
            if name == names[0]:
                pick = max(range(len(candidates)),
                           key=lambda i: scored[name][i]["loglik"]["total"])
                committed = adapted[pick]
            del adapted
        model = committed
        records.append({"t": t, "context": ctx.id, "candidates": [list(c) for c in candidates],
                        "n_sets": len(sets), "policy": list(policy),
                        "pick": list(candidates[pick]),
                        "rewards": scored, "seconds": round(time.time() - t0, 2)})
    return records


def best_fixed(per_seed: list[list[dict]]) -> tuple[int, ...]:
    """The layer set with the best mean seed-A loglik total over every context of every
    seed: the best fixed choice in hindsight (picked on A, scored on B like the oracle)."""
    records = [r for rs in per_seed for r in rs]
    sets = [tuple(c) for c in records[0]["candidates"][: records[0]["n_sets"]]]

    def mean_a(s):
        return sum(r["rewards"]["A"][[tuple(c) for c in r["candidates"]].index(s)]["loglik"]
                   ["total"] for r in records) / len(records)
    return max(sets, key=mean_a)


def _series(records: list[dict], which: str, reward: str = "loglik", part: str = "total",
            fixed: tuple[int, ...] = ()) -> list[float]:
    """Per context, seed B's ``reward`` ``part`` of the candidate ``which`` names: ``oracle``
    (A's pick), ``last`` (the last layer), ``fixed`` (the set ``fixed``), ``policy`` (the
    untrained policy's greedy action) or ``random`` (the mean over every layer set)."""
    out = []
    for r in records:
        cands = [tuple(c) for c in r["candidates"]]
        b = [x[reward][part] for x in r["rewards"]["B"]]
        n_sets = r["n_sets"]
        if which == "oracle":
            out.append(b[cands.index(tuple(r["pick"]))])
        elif which == "last":
            last = max(max(c) for c in cands)
            out.append(b[cands.index((last,))])
        elif which == "fixed":
            out.append(b[cands.index(tuple(fixed))])
        elif which == "policy":
            out.append(b[cands.index(tuple(r["policy"]))])
        else:
            out.append(sum(b[:n_sets]) / n_sets)
    return out


def tie_rates(records: list[dict]) -> dict:
    """Per reward: the share of contexts whose candidates all tie (seed A), and the share of
    candidate pairs that tie."""
    out = {}
    for reward in ("loglik", "supervised"):
        all_tied = pairs = tied = 0
        for r in records:
            vals = [x[reward]["total"] for x in r["rewards"]["A"]]
            all_tied += max(vals) - min(vals) <= TIE
            for a, b in itertools.combinations(vals, 2):
                pairs += 1
                tied += abs(a - b) <= TIE
        out[reward] = {"contexts_all_tied": all_tied / max(1, len(records)),
                       "pairs_tied": tied / max(1, pairs)}
    return out


def summarise(per_seed: list[list[dict]]) -> dict:
    """Margins of the oracle over each comparison, paired on contexts, over seeds."""
    fixed = best_fixed(per_seed)
    summary: dict = {"margins": {}, "means": {}, "best_fixed": list(fixed)}
    kinds = ("oracle", "last", "fixed", "policy", "random")
    for reward, parts in (("loglik", ("total", "acquisition", "forgetting")),
                          ("supervised", ("total",))):
        for part in parts:
            key = f"{reward}.{part}"
            series = {w: [_series(rs, w, reward, part, fixed) for rs in per_seed]
                      for w in kinds}
            summary["means"][key] = {w: sum(map(sum, s)) / sum(map(len, s))
                                     for w, s in series.items()}
            for other in kinds[1:]:
                pooled, seeds = paired_intervals(series["oracle"], series[other])
                summary["margins"][f"{key}: oracle - {other}"] = {
                    "pooled": asdict(pooled), "over_seeds": asdict(seeds),
                    "verdict": verdict(pooled, part != "forgetting", seeds)}
            pooled, seeds = paired_intervals(series["policy"], series["last"])
            summary["margins"][f"{key}: policy - last"] = {
                "pooled": asdict(pooled), "over_seeds": asdict(seeds),
                "verdict": verdict(pooled, part != "forgetting", seeds)}
    picks = Counter(tuple(r["pick"]) for rs in per_seed for r in rs)
    summary["oracle_picks"] = {",".join(map(str, k)): v for k, v in picks.most_common()}
    summary["oracle_pick_entropy_bits"] = pick_entropy_bits(picks.values())
    summary["ties"] = tie_rates([r for rs in per_seed for r in rs])
    return summary


def margin_rows(margins: dict) -> list[str]:
    """One table row per margin: its name, pooled and over-seed intervals (x100), verdict."""
    return [f"| {key} | {format_paired(CI(**m['pooled']), CI(**m['over_seeds']))} | "
            f"{m['verdict']} |" for key, m in margins.items()]


def oracle_markdown(report: dict) -> str:
    """The margins table and what it means for the claim."""
    s = report["summary"]
    lines = [f"Layer oracle on colliding streams ({report['contexts_per_seed']} contexts of "
             f"one domain per seed, domains {', '.join(report['domains'])}; "
             f"{len(report['layer_sets'])} layer sets of 1..{report['oracle_layers']} layers "
             "plus the untrained policy's greedy action; picked with LoRA seed A, scored with "
             f"seed B; fixed = the best fixed set in hindsight, {s['best_fixed']}). Rewards: loglik in nats/token of the gold answers (x100 below), "
             "supervised = 0/1-F1 QA accuracy (pp).", "",
             "| comparison | difference [95% CI] (seeds [lo, hi]) | verdict |", "|---|---|---|"]
    lines += margin_rows(s["margins"])
    lines += ["", "Means (seed B): " + "; ".join(
        f"{k}: " + ", ".join(f"{w} {100 * v:.2f}" for w, v in ms.items())
        for k, ms in s["means"].items()), "",
        "Ties (seed A): " + "; ".join(
            f"{k}: all candidates tie in {100 * v['contexts_all_tied']:.0f}% of contexts, "
            f"{100 * v['pairs_tied']:.0f}% of candidate pairs" for k, v in s["ties"].items()),
        "", f"Oracle picks (layer set: count): {s['oracle_picks']}; entropy "
        f"{s['oracle_pick_entropy_bits']:.2f} bits (a fixed answer: 0)."]
    return "\n".join(lines) + "\n"


def run_oracle(cfg: ExperimentConfig, out: str | Path, progress: bool = True) -> dict:
    """The layer oracle over ``cfg.seeds`` colliding streams; writes ``oracle.json`` (every
    candidate's rewards) and ``oracle.md`` under ``out``."""
    run = RunDir(Path(out))
    run.write_json("config.json", cfg)
    started = time.time()
    base, tok = load_model(cfg)
    replay = replay_pool(cfg, tok)
    streams = colliding_streams(cfg)
    per_seed = [run_stream(base, tok, stream, cfg, cfg.seed + i, replay, progress)
                for i, (_, stream) in enumerate(streams)]
    n = num_layers_of(base)
    report = {"contexts_per_seed": cfg.eval_length, "domains": [d for d, _ in streams],
              "oracle_layers": cfg.oracle_layers,
              "layer_sets": [list(s) for s in layer_sets(n, cfg.oracle_layers)],
              "lora": asdict(cfg.scol.lora), "lam": cfg.scol.lam,
              "forget_window": cfg.scol.forget_window, "summary": summarise(per_seed),
              "records": per_seed, "seconds": round(time.time() - started, 1)}
    run.write_json("oracle.json", report)
    (run.path / "oracle.md").write_text(oracle_markdown(report))
    return report
