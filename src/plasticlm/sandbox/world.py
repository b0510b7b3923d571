"""The sandbox world: fictional entities in five domains, written in real dataset formats.

Everything is drawn from one seed (:class:`WorldConfig`, ``version`` 2). Each domain (drugs,
software libraries, artists, laws, towns; :mod:`plasticlm.sandbox.domains`) has three
closed attributes, one open attribute (a person's name), six paraphrases per closed
attribute and a question per attribute; two relations cross domains (an artist's
birthplace is a town, a law's and a town's country come from one set). Entities are ranked
per domain and mentioned in the corpus a Zipf number of times, so head and tail facts can be
scored apart. Entity roles:

- ``core``: in the pre-training corpus; MC questions on the closed attributes (MMLU layout,
  subject = domain). Half of them also have Q/A lines in the corpus (their questions form
  the ``dev`` split); the other half's questions are held out (``val`` and ``test``): only
  prose teaches them.
- ``specialist``: entities of one domain that only the specialist corpus mentions
  (FedRefine); their questions are in ``specialist_mmlu/`` with the same dev/val/test rule.
- ``unseen``: never in any corpus; SQuAD-style passages with one QA pair per attribute
  (SCoL), LongBench-style long contexts, open-book items and per-domain client streams
  (FedNL; :mod:`plasticlm.sandbox.tasks`).

Q/A lines and questions use the one template of :mod:`plasticlm.eval.prompts`.
"""


from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Literal

from plasticlm.config import Field, configclass
from plasticlm.data.niah import NIAHConfig, make_sample
from plasticlm.data.records import QA, Answer, LongItem, MCQuestion, Passage, Stream
from plasticlm.errors import PlasticError
from plasticlm.sandbox.domains import (
    DOMAIN_NAMES,
    KINDS,
    Attribute,
    Domain,
    Entity,
    build_domains,
    person_name,
    unique_names,
)
from plasticlm.sandbox.passages import biography, filler_sentences, passage_text, qa_block

WORLD_VERSION = 2
DomainName = Literal[DOMAIN_NAMES]   # the five domains, in order


@configclass
class WorldConfig:
    """Sizes of the world (version :data:`WORLD_VERSION`). Defaults are the ``sandbox`` preset's."""

    seed: int = Field(0, description="the one seed everything in the world is drawn from")
    core_per_domain: int = Field(32, ge=8, description="entities in the pre-training corpus, "
                                 "per domain (dev, val and test need at least 8)")
    unseen_per_domain: int = Field(40, ge=1, description="entities only in SQuAD, LongBench, "
                                   "streams and open-book items, per domain")
    specialist_entities: int = Field(400, ge=4, description="entities only the specialist "
                                     "corpus mentions")
    specialist_domain: DomainName = Field("pharmacology", description="the domain of the "
                                          "specialist's private entities")
    specialist_mentions: int = Field(2, ge=0, description="biographies per specialist entity")
    max_mentions: int = Field(20, ge=0, description="biographies of the rank-1 entity of each "
                              "domain")
    min_mentions: int = Field(4, ge=0, description="biographies of the rarest entities")
    zipf_exponent: float = Field(1.0, ge=0, description="s in "
                                 "mentions(rank) = max(min, round(max * rank**-s))")
    qa_copies: int = Field(2, ge=0, description="copies of the Q/A block of each Q/A core entity")
    # 4 copies + 3 biographies left the specialist at 46-48% per split
    specialist_qa_copies: int = Field(8, ge=0, description="copies of the Q/A block of each "
                                      "specialist entity")
    drills: int = Field(100, ge=0, description="retrieval drills (NIAH-style) in the corpus")
    drill_words: tuple[int, int] = Field((36, 80), description="(fewest, most) haystack words "
                                         "of a drill")
    longbench_per_length: int = Field(4, ge=0, description="LongBench-style items per length")
    longbench_words: tuple[int, int, int] = Field((1500, 4000, 12000), description="words of "
                                                  "the short, medium and long items")
    streams: int = Field(4, ge=0, description="SQuAD-style client streams")
    stream_length: int = Field(25, ge=0, description="passages per stream")

    def __post_init__(self):
        if not 0 <= self.drill_words[0] <= self.drill_words[1]:
            raise PlasticError(f"config drill_words must be (fewest, most) with 0 <= fewest <= "
                               f"most, not {list(self.drill_words)}")


@dataclass
class World:
    config: WorldConfig
    domains: list[Domain]
    entities: list[Entity]
    train_docs: list[str]
    valid_docs: list[str]
    specialist_docs: list[str]
    questions: list[MCQuestion]
    specialist_questions: list[MCQuestion]
    question_facts: list[dict]       # per question (same order): fact id, bucket, rank, role
    passages: list[Passage]
    long_items: list[LongItem]
    streams: list[Stream]

    def facts(self) -> list[dict]:
        """One record per (entity, attribute): the value, rank, mentions and bucket."""
        return [{"id": f"{e.id}.{a}", "entity": e.name, "domain": e.domain, "role": e.role,
                 "attribute": a, "value": v, "rank": e.rank, "mentions": e.mentions,
                 "bucket": e.bucket, "qa_in_corpus": e.qa_in_corpus}
                for e in self.entities for a, v in e.attributes.items()]

    def domain(self, name: str) -> Domain:
        return next(d for d in self.domains if d.name == name)


def _bucket(rank: int, n: int) -> str:
    if rank <= max(1, round(0.2 * n)):
        return "head"
    return "tail" if rank > n // 2 else "torso"


def _mc(e: Entity, a: Attribute, split: str, rng: random.Random, index: int) -> MCQuestion:
    right = e.attributes[a.name]
    wrong = rng.sample([v for v in a.values if v != right], 3)
    choices = [right, *wrong]
    rng.shuffle(choices)
    return MCQuestion(e.domain, split, a.question.format(e=e.name), tuple(choices),
                      "ABCD"[choices.index(right)], index)


def find_span(context: str, value: str) -> int:
    """Character offset of ``value`` as a whole word in ``context``."""
    m = re.search(rf"(?<!\w){re.escape(value)}(?!\w)", context)
    if m is None:
        raise AssertionError(f"value {value!r} missing from its own passage")
    return m.start()


def _entities(cfg: WorldConfig, domains: list[Domain], names: dict[str, list[str]],
              rng: random.Random) -> list[Entity]:
    entities = []
    for d in domains:
        pool = names[d.name]
        groups = [("core", pool[: cfg.core_per_domain]),
                  ("unseen", pool[cfg.core_per_domain: cfg.core_per_domain + cfg.unseen_per_domain])]
        if d.name == cfg.specialist_domain:
            groups.append(("specialist", pool[cfg.core_per_domain + cfg.unseen_per_domain:]))
        for role, group in groups:
            for r, name in enumerate(group, 1):
                if role == "core":
                    mentions = max(cfg.min_mentions,
                                   round(cfg.max_mentions * r ** -cfg.zipf_exponent))
                else:
                    mentions = cfg.specialist_mentions if role == "specialist" else 0
                attrs = {}
                for a in d.attributes:
                    if a.closed:
                        attrs[a.name] = rng.choice([v for v in a.values if v != name])
                    else:
                        attrs[a.name] = next(v for v in iter(lambda: person_name(rng), None)
                                             if v != name)
                # Core entities of odd rank have Q/A lines (the dev split); the others are
                # known from prose only. The specialist reads Q/A lines for all its private
                # entities: its splits separate what fusers train on from what they are
                # evaluated on, not what the specialist knows.
                qa = role == "specialist" or (role == "core" and r % 2 == 1)
                entities.append(Entity(f"{d.name}.{role}.{r}", name, d.name, role, r, mentions,
                                       _bucket(r, len(group)), qa, attrs))
    return entities


def _split(e: Entity) -> str:
    if e.rank % 2 == 1:
        return "dev"
    return "val" if e.rank % 4 == 2 else "test"


def generate_world(cfg: WorldConfig | None = None) -> World:
    """Build the whole world from ``cfg.seed`` (seconds at default sizes)."""
    cfg = cfg or WorldConfig()
    rng = random.Random(cfg.seed)
    used: set[str] = set()
    names = {d: unique_names(KINDS[d], cfg.core_per_domain + cfg.unseen_per_domain
                             + (cfg.specialist_entities if d == cfg.specialist_domain else 0),
                             rng, used) for d in DOMAIN_NAMES}
    domains = build_domains(tuple(names["geography"][:24]))
    by_name = {d.name: d for d in domains}
    entities = _entities(cfg, domains, names, rng)

    def corpus(role: str) -> list[str]:
        # The specialist's private corpus states only the closed facts, once per mention:
        # the facts its questions ask, densely enough to be learnt in minutes.
        lean = role == "specialist"
        docs = []
        for e in entities:
            if e.role != role:
                continue
            d = by_name[e.domain]
            docs += [biography(e, d, rng, extra=0 if lean else 1, closed_only=lean)
                     for _ in range(e.mentions)]
            if e.qa_in_corpus:
                copies = cfg.specialist_qa_copies if lean else cfg.qa_copies
                docs += [qa_block(e, d, rng, closed_only=lean) for _ in range(copies)]
        return docs

    train_docs = corpus("core")
    filler = filler_sentences(400, seed=cfg.seed + 1)
    drill_tasks = ("single",) * 6 + ("multikey",) * 3 + ("numeric",)
    for i in range(cfg.drills):
        task = drill_tasks[i % len(drill_tasks)]
        # Four needles and their question take ~50 words before any haystack fits.
        words = rng.randint(*cfg.drill_words) + (40 if task == "multikey" else 0)
        s = make_sample(NIAHConfig(task, words, rng.random()), filler, seed=cfg.seed * 7919 + i)
        train_docs.append(s.prompt + s.target)
    rng.shuffle(train_docs)
    valid_docs = [biography(e, by_name[e.domain], rng) for e in entities if e.role == "core"]
    specialist_docs = corpus("specialist")
    rng.shuffle(specialist_docs)

    def questions(role: str) -> tuple[list[MCQuestion], list[dict]]:
        qs, meta = [], []
        counters: dict[tuple[str, str], int] = {}
        for e in entities:
            if e.role != role:
                continue
            split = _split(e)
            for a in by_name[e.domain].closed_attributes:
                k = (e.domain, split)
                counters[k] = counters.get(k, 0) + 1
                qs.append(_mc(e, a, split, rng, counters[k] - 1))
                meta.append({"subject": e.domain, "split": split, "index": counters[k] - 1,
                             "fact": f"{e.id}.{a.name}", "entity": e.id, "bucket": e.bucket,
                             "rank": e.rank, "mentions": e.mentions, "role": role})
        return qs, meta

    core_q, core_meta = questions("core")
    spec_q, spec_meta = questions("specialist")

    unseen = [e for e in entities if e.role == "unseen"]
    passages = []
    for e in unseen:
        d = by_name[e.domain]
        context = passage_text(e, d, rng)
        qas = tuple(QA(f"{e.id}.{a.name}", a.question.format(e=e.name),
                       (Answer(e.attributes[a.name], find_span(context, e.attributes[a.name])),))
                    for a in d.attributes)
        passages.append(Passage(e.name, context, qas))

    core_bios = [biography(e, by_name[e.domain], rng) for e in entities if e.role == "core"]
    long_items = []
    for length, words in zip(("short", "medium", "long"), cfg.longbench_words):
        for i in range(cfg.longbench_per_length):
            target = rng.choice(unseen)
            a = rng.choice(by_name[target.domain].closed_attributes)
            target_passage = next(p for p in passages if p.title == target.name).context
            pieces = [target_passage]
            others = [p.context for p in passages if p.title != target.name]
            total = len(target_passage.split())
            while total < words:
                piece = rng.choice(others if rng.random() < 0.3 else core_bios)
                pieces.append(piece)
                total += len(piece.split())
            rng.shuffle(pieces)
            q = _mc(target, a, "test", rng, 0)
            long_items.append(LongItem(f"world-{length}-{i}", target.domain, a.name,
                                       "easy" if length == "short" else "hard", length,
                                       q.question, q.choices, q.answer, "\n\n".join(pieces)))

    titles = [p.title for p in passages]
    streams = [Stream(f"squad-{i}", "squad", rng.sample(titles, min(cfg.stream_length, len(titles))))
               for i in range(cfg.streams)]
    return World(cfg, domains, entities, train_docs, valid_docs, specialist_docs, core_q, spec_q,
                 core_meta + spec_meta, passages, long_items, streams)
