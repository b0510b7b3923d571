"""Does a model read its context? One probe per reading target of sandbox v3.

Every probe asks about the world's *unseen* entities (never in any corpus) or fresh needles,
with full attention, scored by 4-way choice (chance 25%) with a 95% bootstrap interval over
entities (or samples):

- ``openbook``: the world's open-book items (passage, 40-80 words of filler, question);
- ``heldout_phrasing``: the same with a passage written only in each attribute's last
  paraphrase, which reading documents never use (:func:`sandbox.reading.heldout_passage`);
- ``stated``: the gold answer stated one line above in the T2T form (``Q: .. A: gold.``
  then the question again);
- ``distractors``: three passages about different entities, the question about one;
- ``multikey``: key-value needles with the other keys' values as the wrong choices;
- ``vartrack``: the chain of variables holding a value, against the same chain ending in a
  decoy chain's variable.
"""

from __future__ import annotations

import random
import re

from plasticlm.data.niah import generate_niah
from plasticlm.eval import (
    bootstrap_ci,
    closed_set_accuracy,
    encode_pair,
    pad_id_of,
    qa_line,
    qa_prompt,
    score_continuations,
)
from plasticlm.sandbox.probes import evaluate_openbook, niah_choice
from plasticlm.sandbox.reading import heldout_passage
from plasticlm.sandbox.tasks import _choices, filler_text
from plasticlm.sandbox.world import World

READING_PROBES = ("openbook", "heldout_phrasing", "stated", "distractors", "multikey",
                  "vartrack")


def _entry(correct: list[float], groups: list[str]) -> dict:
    ci = bootstrap_ci(correct, groups=groups)
    return {"accuracy": round(ci.mean, 4), "low": round(ci.low, 4), "high": round(ci.high, 4),
            "n": len(correct)}


def _entity_items(world: World, probe: str, n: int, filler: tuple[int, int], seed: int):
    rng = random.Random(f"{probe}:{seed}")
    unseen = [e for e in world.entities if e.role == "unseen"]
    by_name = {d.name: d for d in world.domains}
    items = []
    for i in range(n):
        e = unseen[i % len(unseen)]
        d = by_name[e.domain]
        a = rng.choice(d.attributes)
        question = a.question.format(e=e.name)
        right = e.attributes[a.name]
        if probe == "stated":
            context = qa_line(question, right) + "\n"
        elif probe == "distractors":
            others = rng.sample([x for x in unseen if x is not e], 2)
            passages = [p.context for p in world.passages if p.title in {e.name}
                        | {x.name for x in others}]
            rng.shuffle(passages)
            context = "\n".join(passages) + "\n"
        else:
            passage = heldout_passage(e, d)
            context = f"{passage}\n{filler_text(rng.randint(*filler), rng)}\n"
        choices, answer = _choices(world, e.domain, a.name, right, rng)
        items.append((context + qa_prompt(question), list(choices), answer, e.id))
    return items


def _vartrack_choice(model, tokenizer, samples, seed: int) -> list[float]:
    """4-way choice of the whole answer (the chain's variables in order), against the same
    chain ending in each of the decoy chain's two variables or in a name the context never
    states: only the chain's last link tells them apart."""
    rng = random.Random(seed)
    contexts, conts = [], []
    for s in samples:
        decoys = _decoy_vars(s.context, s.answers)[:2]
        while len(decoys) < 3:
            name = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(3))
            if name not in s.context and name not in decoys:
                decoys.append(name)
        for last in [s.answers[-1], *decoys]:
            c, x = encode_pair(tokenizer, s.prompt, " " + ", ".join([*s.answers[:-1], last])
                               + ".")
            contexts.append(c)
            conts.append(x)
    scored = score_continuations(model, contexts, conts, pad_id_of(tokenizer), 16, "right")
    return [float(max(range(4), key=lambda j: scored[4 * i + j].logprob) == 0)
            for i in range(len(samples))]


def _decoy_vars(context: str, chain: list[str]) -> list[str]:
    names = re.findall(r"VAR ([A-Z]{3}) =", context)
    return [n for n in dict.fromkeys(names) if n not in chain]


def evaluate_reading(model, tokenizer, world: World, sentences: list[str], n: int = 200,
                     needle_tokens: int = 224, filler: tuple[int, int] = (40, 80),
                     seed: int = 0) -> dict:
    """Each probe of :data:`READING_PROBES` as ``{"accuracy", "low", "high", "n"}``:
    ``n`` items per entity probe over the unseen entities, ``n // 4`` needle samples of
    ``needle_tokens`` tokens whose haystack is ``sentences``."""
    out = {"openbook": evaluate_openbook(model, tokenizer, world, filler, n, seed)["all"]}
    for probe in ("heldout_phrasing", "stated", "distractors"):
        items = _entity_items(world, probe, n, filler, seed)
        res = closed_set_accuracy(model, tokenizer, [p for p, *_ in items],
                                  [c for _, c, *_ in items], [a for _, _, a, _ in items],
                                  batch_size=16)
        out[probe] = _entry(list(res.correct), [g for *_, g in items])
    m = max(8, n // 4)
    keys = generate_niah("multikey", m, needle_tokens, sentences, seed=seed + 7,
                         tokenizer=tokenizer)
    out["multikey"] = _entry(niah_choice(model, tokenizer, keys, seed=seed),
                             [s.id for s in keys])
    chains = generate_niah("vartrack", m, needle_tokens, sentences, seed=seed + 11,
                           tokenizer=tokenizer)
    out["vartrack"] = _entry(_vartrack_choice(model, tokenizer, chains, seed),
                             [s.id for s in chains])
    return out


_TITLES = {"openbook": "open-book", "heldout_phrasing": "open-book, held-out phrasing",
           "stated": "answer stated (T2T)", "distractors": "3 passages (2 distractors)",
           "multikey": "multi-key needle, decoys", "vartrack": "variable tracking"}


def reading_table(report: dict) -> str:
    """The reading probes of a preset report (members that have them) as a Markdown table;
    empty when no member has them."""
    members = {n: m["reading"] for n, m in report["models"].items() if "reading" in m}
    if not members:
        return ""

    def cell(e: dict) -> str:
        return (f"{100 * e['accuracy']:.1f} [{100 * e['low']:.1f}, {100 * e['high']:.1f}] "
                f"n={e['n']}")

    rows = ["| model | " + " | ".join(_TITLES[p] for p in READING_PROBES) + " |",
            "|---|" + "---|" * len(READING_PROBES)]
    rows += [f"| {n} | " + " | ".join(cell(r[p]) if p in r else "-" for p in READING_PROBES)
             + " |" for n, r in members.items()]
    return "\n".join(rows) + ("\n\nreading, full attention, held-out (unseen) entities or fresh "
                              "needles; 4-way choice, chance 25%; [95% interval over entities "
                              "or samples]")
