"""One inner update writes a passage's facts into the weights, beside its two controls.

Each of ``passages`` unseen-entity passages of the sandbox world is learned by one LoRA
update (SCoL's inner update) of the untouched receiver on one layer's MLP; every closed
attribute is scored by closed-set ranking (its legal values ranked by log-likelihood) after
the QA prompt. Rows, per passage and LoRA seed:

- (a) untouched: the receiver on the passage entity's questions (control 1);
- (b) one update: the updated model on the same questions (the result);
- (c) paired entity: the updated model on the same attributes of another unseen entity of
  the domain, never shown (its own value the target; control 2: a shifted value prior);
- (a') the untouched receiver on the paired entity's questions (the baseline of (c));
- leak: how often (c) and (a') rank the passage entity's value first for the partner.

:func:`run_one_update` returns the report, :func:`one_update_table` renders it;
``plasticlm demo`` and ``bench/scol_depth.py`` (which shares :func:`probe_items`) call them.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import asdict, replace

log = logging.getLogger("plasticlm.scol")

ROWS = {"a": "(a) untouched, passage entity", "b": "(b) one update, passage entity",
        "c": "(c) one update, paired entity never shown",
        "a2": "(a') untouched, paired entity",
        # a shifted prior shows here in full; (c) credits it only where the two values agree
        "c_leak": "(c) picks the passage entity's value for the paired entity",
        "a2_leak": "(a') picks the passage entity's value for the paired entity"}
SHORT = {"a": "(a)", "b": "(b)", "c": "(c)", "a2": "(a')", "c_leak": "leak (c)",
         "a2_leak": "leak (a')"}
# b-c_leak: the passage's value asked of its entity vs of the partner (the same target)
DIFFS = {"b-a": ("b", "a"), "b-c": ("b", "c"), "c-a2": ("c", "a2"),
         "leak": ("c_leak", "a2_leak"), "b-c_leak": ("b", "c_leak")}
# The demo's sizes: 94-124 s with 1 torch thread on 2 shared CPU cores (sandbox v2). The last
# layer's MLP is where one update writes most that a question reads (bench/results/scol_depth.md).
DEMO_SIZES = dict(passages=15, seeds=3, layer=-1)
QUICK_SIZES = dict(passages=2, seeds=2, layer=-1)


def _prefix(template: str, entity: str) -> str | None:
    """The statement up to its value, or None where the value comes before the entity."""
    if template.index("{v}") < template.index("{e}"):
        return None
    return template.split("{v}")[0].format(e=entity).rstrip()


def passage_items(world, passage) -> list[dict]:
    """Per closed attribute of ``passage``'s entity: the three prompts (a form its templates
    cannot make is None), the legal values and the answer."""
    from plasticlm.eval.prompts import qa_prompt
    from plasticlm.sandbox.passages import render

    e = next(x for x in world.entities if x.name == passage.title)
    items = []
    for a in world.domain(e.domain).closed_attributes:
        value = e.attributes[a.name]
        used = [s for s in a.statements if render(s, e, value) in passage.context]
        others = [s for s in a.statements if s not in used and _prefix(s, e.name)]
        items.append({"passage": passage.context, "entity": e.name, "attribute": a.name,
                      "values": list(a.values), "answer": value,
                      "verbatim": _prefix(used[0], e.name) if used else None,
                      "paraphrase": _prefix(others[0], e.name) if others else None,
                      "question": qa_prompt(a.question.format(e=e.name))})
    return items


def _shuffled(world, seed: int) -> list:
    passages = list(world.passages)   # one per unseen entity
    random.Random(seed).shuffle(passages)
    return passages


def probe_items(world, n: int, seed: int = 0) -> list[dict]:
    """:func:`passage_items` of the first ``n`` unseen passages in a ``seed`` shuffle."""
    return [it for p in _shuffled(world, seed)[:n] for it in passage_items(world, p)]


def paired_passages(world, n: int, seed: int = 0) -> list[tuple]:
    """``n`` (passage, partner) pairs in a ``seed`` shuffle: the partner is the next unseen
    passage of the same domain (so the same attributes), and no passage is in two pairs, so
    a partner is never trained on. Domains with nothing left to pair are skipped."""
    order = _shuffled(world, seed)
    domain = {e.name: e.domain for e in world.entities}
    taken, pairs = set(), []
    for i, p in enumerate(order):
        if len(pairs) == n:
            break
        if p.title in taken:
            continue
        q = next((q for q in order[i + 1:] if q.title not in taken
                  and domain[q.title] == domain[p.title]), None)
        if q is not None:
            taken |= {p.title, q.title}
            pairs.append((p, q))
    if len(pairs) < n:
        raise ValueError(f"the world pairs only {len(pairs)} unseen passages, not {n}")
    return pairs


def _chosen(model, tok, items: list[dict]) -> list[str]:
    """The legal value ranked first after each item's QA prompt."""
    from plasticlm.eval import closed_set_choice

    picks = closed_set_choice(model, tok, [it["question"] for it in items],
                              [it["values"] for it in items])
    return [it["values"][i] for it, i in zip(items, picks)]


def _hits(chosen: list[str], items: list[dict]) -> list[float]:
    return [float(c == it["answer"]) for c, it in zip(chosen, items)]


def run_one_update(receiver_folder, world, passages: int = 15, layer: int = -1,
                   seeds: int = 3, lora=None, steps: int | None = None,
                   progress: bool = True) -> dict:
    """The rows [seeds][items] for ``passages`` paired unseen passages, each learned by one
    update of ``layer`` (negative: from the last) per LoRA ``seed``.

    ``lora``: the :class:`LoraTrainConfig` (default: MLP, lr 3e-3, 30 steps, no replay);
    ``steps`` overrides its steps. Returns sizes, ``table`` (per row its accuracy interval,
    per difference its paired item and seeds intervals; entities clustered over seeds),
    ``correct`` [row][seed][item], ``scored`` (per item: entity, partner, attribute),
    ``changed`` (parameters any update changed) and ``chance``.
    """
    from plasticlm.eval import paired_intervals, pooled_bootstrap_ci
    from plasticlm.models import load_causal_lm
    from plasticlm.scol import consolidate as c

    if lora is None:   # the setting of bench/results/scol_depth.md that questions can read
        lora = c.LoraTrainConfig(target_modules=c.MODULES["mlp"], lr=3e-3, steps=30, replay=0)
    if steps is not None:
        lora = replace(lora, steps=steps)
    model, tok = load_causal_lm(receiver_folder, dtype="float32", device="cpu")
    n_layers = model.config.num_hidden_layers
    layer = layer % n_layers if -n_layers <= layer < n_layers else None
    if layer is None:
        raise ValueError(f"layer must be in -{n_layers}..{n_layers - 1}")
    pairs = paired_passages(world, passages)
    own = [passage_items(world, p) for p, _ in pairs]
    # the partner's question about each of the passage's attributes, its own value the target
    partner = [[next(it for it in passage_items(world, q) if it["attribute"] == x["attribute"])
                for x in items] for (_, q), items in zip(pairs, own)]
    groups = [x["entity"] for items in own for x in items]   # a pair's cluster: its passage
    correct = {r: [] for r in ROWS}
    changed: set[str] = set()
    for seed in range(seeds):
        t, got = time.time(), {r: [] for r in ROWS}
        for k, ((p, _), items, other) in enumerate(zip(pairs, own, partner)):
            # untouched scored each seed, after the last seed's updates: they must not leak in
            got["a"] += _hits(_chosen(model, tok, items), items)
            picked = _chosen(model, tok, other)
            got["a2"] += _hits(picked, other)
            got["a2_leak"] += _hits(picked, items)
            # LoRA init differs per seed and passage; adapt_lora leaves ``model`` untouched
            windows = c.context_windows(tok, p.context, lora.max_tokens)
            adapted, _ = c.adapt_lora(model, [layer], windows, lora, seed=seed * 1000 + k)
            changed |= set(c.changed_parameters(model, adapted))
            got["b"] += _hits(_chosen(adapted, tok, items), items)
            picked = _chosen(adapted, tok, other)
            got["c"] += _hits(picked, other)
            got["c_leak"] += _hits(picked, items)
        for r in ROWS:
            correct[r].append(got[r])
        if progress:
            log.info("one update, seed %d: " + ", ".join(f"{r} %.1f%%" for r in ROWS) + " (%.0f s)",
                     seed, *(100 * sum(got[r]) / len(got[r]) for r in ROWS), time.time() - t)
    per_seed_groups = [groups] * seeds
    table = {}
    for r, name in ROWS.items():
        table[r] = {"name": name, "accuracy": asdict(pooled_bootstrap_ci(
            correct[r], groups_per_seed=per_seed_groups))}
    for d, (x, y) in DIFFS.items():
        pooled, over = paired_intervals(correct[x], correct[y], per_seed_groups)
        table[d] = {"pooled": asdict(pooled), "over_seeds": asdict(over)}
    items = [x for items in own for x in items]
    return {"passages": passages, "seeds": seeds, "layer": layer, "layers": n_layers,
            "lora": {"modules": list(lora.target_modules), "lr": lora.lr, "steps": lora.steps,
                     "rank": lora.rank},
            "items": len(items),
            "scored": [[x["entity"], o["entity"], x["attribute"]]   # per item, as scored
                       for xs, os in zip(own, partner) for x, o in zip(xs, os)],
            "chance": sum(1 / len(x["values"]) for x in items) / len(items),
            "table": table, "correct": correct, "changed": sorted(changed)}


def one_update_table(report: dict) -> str:
    """The report as Markdown: the rows' accuracy [95% CI], then the differences
    [paired 95% CI] (seeds interval), then the chance line."""
    from plasticlm.eval import CI, format_ci, format_paired

    t, lo = report["table"], report["lora"]
    lines = [f"| one inner update (layer {report['layer']} of 0-{report['layers'] - 1}: "
             f"{'/'.join(lo['modules'])}, lr {lo['lr']:g}, {lo['steps']} steps; "
             f"{report['passages']} unseen passages x {report['seeds']} seeds, "
             f"{report['items']} closed attributes) | closed-set accuracy, % [95% CI] |",
             "|---|---|"]
    lines += [f"| {t[r]['name']} | {format_ci(CI(**t[r]['accuracy']))} |" for r in ROWS]
    for d, (x, y) in DIFFS.items():
        lines.append(f"| {SHORT[x]} - {SHORT[y]} [paired 95% CI] (seeds) | "
                     f"{format_paired(CI(**t[d]['pooled']), CI(**t[d]['over_seeds']))} |")
    lines += ["", f"Chance: {100 * report['chance']:.1f}% (a legal value at random). Intervals "
              "resample entities (a passage with its partner) over seeds. (b) - (c) > 0: the "
              "update wrote more than the attribute's value prior; leak: the partner given the "
              "passage's value (a shifted prior), so (b) - leak (c) is what it wrote for its "
              "entity alone."]
    return "\n".join(lines)
