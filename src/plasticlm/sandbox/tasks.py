"""Tasks over the world's unseen entities where the evidence lies far back in the context.

- **Open-book items**: an unseen entity's passage, then filler, then a question about the
  passage: with a short attention window, only a memory of the context can answer.
- **Client streams**: per domain, one long stream of that domain's passages with questions
  about entities introduced earlier interleaved later (never reset): the setting of a
  private memory that builds over a client's context.
- **Long items**: LongBench-v2-format documents, as many per length regime as asked, each
  hiding one unseen entity's passage among other passages and biographies.

Open-book items and client streams are JSON lines (:mod:`plasticlm.data.context_tasks`);
everything is deterministic by seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from plasticlm.data.context_tasks import (
    OpenBookItem,
    StreamSegment,
    write_client_streams,
    write_openbook,
)
from plasticlm.data.records import LETTERS, LongItem
from plasticlm.errors import PlasticError
from plasticlm.sandbox.domains import person_name
from plasticlm.sandbox.passages import filler_sentences, passage_text
from plasticlm.sandbox.world import World


def _choices(world: World, domain: str, attribute: str, right: str,
             rng: random.Random, n: int = 4) -> tuple[tuple[str, ...], int]:
    a = next(x for x in world.domain(domain).attributes if x.name == attribute)
    if a.closed:
        wrong = rng.sample([v for v in a.values if v != right], n - 1)
    else:
        wrong = []
        while len(wrong) < n - 1:
            v = person_name(rng)
            if v != right and v not in wrong:
                wrong.append(v)
    choices = [right, *wrong]
    rng.shuffle(choices)
    return tuple(choices), choices.index(right)


def filler_text(words: int, rng: random.Random) -> str:
    """At least ``words`` words of neutral filler sentences (none if ``words`` <= 0)."""
    out: list[str] = []
    while sum(len(s.split()) for s in out) < words:
        out += filler_sentences(8, seed=rng.randrange(1 << 30))
    return " ".join(out)


def openbook_items(world: World, filler_words: tuple[int, int] = (40, 80),
                   domains: Sequence[str] | None = None, seed: int = 0) -> list[OpenBookItem]:
    """One item per (unseen entity, attribute) of ``domains`` (default all), with
    ``filler_words`` (a range) of neutral filler between the passage and the question."""
    rng = random.Random(seed)
    wanted = set(domains or [d.name for d in world.domains])
    items = []
    for e in world.entities:
        if e.role != "unseen" or e.domain not in wanted:
            continue
        d = world.domain(e.domain)
        passage = passage_text(e, d, rng)
        for a in d.attributes:
            n = rng.randint(*filler_words)
            choices, answer = _choices(world, e.domain, a.name, e.attributes[a.name], rng)
            items.append(OpenBookItem(f"{e.id}.{a.name}", e.domain, e.name, a.name, a.closed,
                                      passage + "\n" + filler_text(n, rng),
                                      a.question.format(e=e.name), choices, answer, n))
    return items


def long_items(world: World, per_length: int, seed: int = 0) -> list[LongItem]:
    """``per_length`` LongBench-v2-format items per regime of ``world.config.longbench_words``
    (short, medium, long): an unseen entity's passage shuffled among other unseen entities'
    passages and core entities' validation biographies up to the regime's word count, with a
    four-choice question about one of its closed attributes. The world file holds
    ``longbench_per_length`` items; this draws any number from the same world, unchanged."""
    if per_length < 1:
        raise PlasticError(f"per_length must be >= 1, not {per_length}")
    rng = random.Random(f"long-items:{seed}")
    unseen = {e.name: e for e in world.entities if e.role == "unseen"}
    passages = [p for p in world.passages if p.title in unseen]
    if len(passages) < 2 or not world.valid_docs:
        raise PlasticError("the world needs unseen passages and validation biographies to "
                           "build long items")
    items = []
    for length, words in zip(("short", "medium", "long"), world.config.longbench_words):
        for i in range(per_length):
            target = rng.choice(passages)
            e = unseen[target.title]
            a = rng.choice(world.domain(e.domain).closed_attributes)
            pieces, total = [target.context], len(target.context.split())
            while total < words:
                other = rng.choice(passages)
                piece = (other.context if rng.random() < 0.3 and other is not target
                         else rng.choice(world.valid_docs))
                pieces.append(piece)
                total += len(piece.split())
            rng.shuffle(pieces)
            choices, answer = _choices(world, e.domain, a.name, e.attributes[a.name], rng)
            items.append(LongItem(f"long-{length}-{seed}-{i}", e.domain, a.name,
                                  "easy" if length == "short" else "hard", length,
                                  a.question.format(e=e.name), choices, LETTERS[answer],
                                  "\n\n".join(pieces)))
    return items


def client_stream(world: World, domain: str, min_lag: int = 3, questions_per_passage: float = 1.0,
                  seed: int = 0) -> list[StreamSegment]:
    """The passages of ``domain``'s unseen entities in a random order; after each passage,
    about ``questions_per_passage`` questions on entities at least ``min_lag`` passages back
    (each attribute asked once)."""
    rng = random.Random(seed)
    entities = [e for e in world.entities if e.role == "unseen" and e.domain == domain]
    if not entities:
        raise PlasticError(f"the world has no unseen entities in domain {domain!r}")
    rng.shuffle(entities)
    d = world.domain(domain)
    pending: list[tuple[int, object, object]] = []
    segments: list[StreamSegment] = []
    for i, e in enumerate(entities):
        segments.append(StreamSegment("text", passage_text(e, d, rng), e.name))
        pending += [(i, e, a) for a in d.attributes]
        ready = [p for p in pending if i - p[0] >= min_lag]
        k = int(questions_per_passage) + (rng.random() < questions_per_passage % 1)
        for p in rng.sample(ready, min(k, len(ready))):
            pending.remove(p)
            j, ent, a = p
            value = ent.attributes[a.name]
            choices, _ = _choices(world, domain, a.name, value, rng)
            segments.append(StreamSegment("question", a.question.format(e=ent.name), ent.name,
                                          a.name, value, choices, i - j))
    return segments


def write_world_tasks(world: World, out: str | Path, seed: int = 0) -> Path:
    """``openbook/items.jsonl`` and ``client_streams.jsonl`` beside a written world."""
    out = Path(out)
    write_openbook(out / "openbook" / "items.jsonl", openbook_items(world, seed=seed))
    write_client_streams(out / "client_streams.jsonl",
                         {d.name: client_stream(world, d.name, seed=seed + i)
                          for i, d in enumerate(world.domains)})
    return out
