"""What a sandbox model knows: held-out multiple choice and needle retrieval, with intervals.

Every accuracy comes with a 95% bootstrap interval over entities (the three questions about
one entity move together), from :func:`plasticlm.eval.bootstrap_ci`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from plasticlm.data.mmlu import load_mmlu
from plasticlm.data.niah import generate_niah, score
from plasticlm.eval import (
    MCConfig,
    bootstrap_ci,
    closed_set_accuracy,
    evaluate_mc_items,
    generate_texts,
)
from plasticlm.eval.niah import niah_choice, same_format_decoy  # noqa: F401 (re-exported)
from plasticlm.eval.prompts import context_prompt
from plasticlm.sandbox.tasks import openbook_items
from plasticlm.sandbox.world import World
from plasticlm.sandbox.world_index import question_meta, read_world_index


def _ci_entry(correct: list[float], groups: list[str] | None = None) -> dict:
    ci = bootstrap_ci(correct, groups=groups)
    return {"accuracy": round(ci.mean, 4), "low": round(ci.low, 4), "high": round(ci.high, 4),
            "n": len(correct)}


def world_mc_items(model, tokenizer, world_dir: Path, role: str = "core",
                   splits: tuple[str, ...] = ("val", "test")) -> list[dict]:
    """One record per question of ``role`` in ``splits``: ``correct`` (0/1), ``entity``,
    ``split``, ``domain``, ``bucket``; every choice is scored as a continuation of the one
    QA prompt (chance 25%). Paired comparisons of two models match records by position."""
    folder = Path(world_dir) / ("mmlu" if role == "core" else "specialist_mmlu")
    meta = question_meta(read_world_index(world_dir), role)
    qs = [q for s in splits for q in load_mmlu(folder, s)]
    result = evaluate_mc_items(model, tokenizer, qs, MCConfig(method="continuation",
                                                              batch_size=32))
    items = []
    for ok, q in zip(result.correct, qs):
        m = meta[(q.subject, q.split, q.index)]
        items.append({"correct": float(ok), "entity": m.get("entity", m["fact"].rsplit(".", 1)[0]),
                      "split": q.split, "domain": q.subject, "bucket": m["bucket"]})
    return items


def evaluate_world_mc(model, tokenizer, world_dir: Path, role: str = "core",
                      splits: tuple[str, ...] = ("val", "test")) -> dict:
    """MC accuracy on a world's questions of ``role`` in ``splits`` (:func:`world_mc_items`),
    overall and per split, domain and head/torso/tail bucket, each ``{"accuracy", "low",
    "high", "n"}`` with an interval over entities."""
    groups: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for it in world_mc_items(model, tokenizer, world_dir, role, splits):
        for g in ("all", f"split/{it['split']}", f"domain/{it['domain']}",
                  f"bucket/{it['bucket']}"):
            groups[g].append((it["correct"], it["entity"]))
    return {g: _ci_entry([x for x, _ in v], [e for _, e in v])
            for g, v in sorted(groups.items())}


def evaluate_openbook(model, tokenizer, world: World, filler_words: tuple[int, int] = (40, 80),
                      n: int = 400, seed: int = 0) -> dict:
    """Open-book reading with full attention: the world's open-book items (an unseen
    entity's passage, ``filler_words`` of filler, a question; every other entity, up to
    ``n`` items), scored by 4-way choice; overall, closed and open attributes, each with an
    entity-clustered interval (chance 25%)."""
    items = openbook_items(world, filler_words=filler_words, seed=seed)
    entities = sorted({it.entity for it in items})[::2]
    keep = set(entities)
    items = [it for it in items if it.entity in keep][:n]
    result = closed_set_accuracy(model, tokenizer, [context_prompt(it.context, it.question) for it in items],
                                 [list(it.choices) for it in items],
                                 [it.answer for it in items], batch_size=16)
    out = {}
    for name, pick in (("all", lambda it: True), ("closed", lambda it: it.closed),
                       ("open", lambda it: not it.closed)):
        rows = [(ok, it.entity) for ok, it in zip(result.correct, items) if pick(it)]
        if rows:
            out[name] = _ci_entry([x for x, _ in rows], [e for _, e in rows])
    return out


def evaluate_niah(model, tokenizer, sentences: list[str], probes, n: int, seed: int = 0) -> dict:
    """Per ``(task, length in tokens)`` probe: the mean task score of greedy answers
    (``score``, RULER's measure) and retrieval by 4-way choice (``choice``, chance 0.25),
    each with its interval."""
    out = {}
    for task, length in probes:
        samples = generate_niah(task, n, length, sentences, seed=seed, tokenizer=tokenizer)
        preds = generate_texts(model, tokenizer, [s.prompt for s in samples],
                               max_new_tokens=12, stop=("\n",))
        out[f"{task}/{length}"] = {
            "score": _ci_entry([score(s, p) for s, p in zip(samples, preds)]),
            "choice": _ci_entry(niah_choice(model, tokenizer, samples, seed=seed)),
            "mean_length": round(sum(s.length for s in samples) / n, 1),
            "example": {"answers": samples[0].answers, "prediction": preds[0]}}
    return out


def _cell(entry: dict | None) -> str:
    if not entry:
        return "-"
    return (f"{100 * entry['accuracy']:.1f} [{100 * entry['low']:.1f}, "
            f"{100 * entry['high']:.1f}] n={entry['n']}")


def probe_table(report: dict) -> str:
    """The preset report as a Markdown table: held-out MC overall and per bucket, the
    specialist's facts per split, needle retrieval by choice; 95% intervals over entities."""
    rows = ["| model | layers x hidden | core held-out MC | head | torso | tail | "
            "specialist dev | specialist val | specialist test | needle choice | open-book |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in report["models"].items():
        core, spec = m["mc_core_heldout"], m["mc_specialist"]
        needle = "; ".join(f"{k}: {_cell(v['choice'])}" for k, v in m.get("niah", {}).items())
        d = m["describe"]
        rows.append(f"| {name} | {d['layers']} x {d['hidden']} | {_cell(core['all'])} | "
                    f"{_cell(core.get('bucket/head'))} | {_cell(core.get('bucket/torso'))} | "
                    f"{_cell(core.get('bucket/tail'))} | {_cell(spec.get('split/dev'))} | "
                    f"{_cell(spec.get('split/val'))} | {_cell(spec.get('split/test'))} | "
                    f"{needle or '-'} | {_cell(m.get('openbook', {}).get('all'))} |")
    return "\n".join(rows) + ("\n\nchance: MC, needle choice and open-book 25%; [95% interval "
                              "over entities]; open-book: an unseen entity's passage, filler, "
                              "a question, full attention")
