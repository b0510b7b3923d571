"""Reading documents for pre-training: fresh, never-repeated texts that only reading answers.

Each document is a list of :class:`Segment` s, text pieces with a flag saying whether the
loss is on them (the answers always; the context when :attr:`ReadingMix.context_loss`). Every
entity is made up per document with fresh values (a name no world entity has), so no
memory of the corpus can answer: only the context can. Kinds, in the world's own formats
(the one QA template of :mod:`plasticlm.eval.prompts`):

- ``openbook``: one passage, 0-N words of filler, Q/A lines about it;
- ``distractors``: several passages about different entities, Q/A lines about some of them;
- ``stated``: a Q/A line, then the same question again (the T2T form: copy a stated answer);
- ``multikey``: key-value needles with decoys in a haystack of the world's sentences;
- ``vartrack``: variable chains with decoy chains in the same haystack.

With :attr:`ReadingMix.closed_book_share`, a document also asks a closed-book question about
a core entity whose Q/A lines are in the corpus (no passage about it in context), so the
QA template does not come to mean "copy from the context" (docs/sandbox.md). Reading
passages never use the last paraphrase of each attribute, so probes can measure reading on
held-out phrasings (:func:`heldout_passage`).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace
from typing import NamedTuple

from plasticlm.data.niah import generate_niah
from plasticlm.errors import PlasticError
from plasticlm.eval.prompts import qa_continuation, qa_line, qa_prompt
from plasticlm.sandbox.domains import KINDS, Attribute, Domain, Entity, entity_name, person_name
from plasticlm.sandbox.passages import _INTROS, render, shuffle_statements
from plasticlm.sandbox.tasks import filler_text
from plasticlm.sandbox.world import World

KINDS_OF_READING = ("openbook", "distractors", "stated", "multikey", "vartrack")


class Segment(NamedTuple):
    """A piece of a document; ``answer`` marks text the loss is always on."""

    text: str
    answer: bool


@dataclass(frozen=True)
class ReadingMix:
    """What share of pre-training documents are reading documents, and of which kinds."""

    share: float = 0.5                      # of documents drawn (the rest: world corpus)
    kinds: tuple[tuple[str, float], ...] = (("openbook", 0.3), ("distractors", 0.3),
                                            ("stated", 0.1), ("multikey", 0.15),
                                            ("vartrack", 0.15))
    filler_words: tuple[int, int] = (0, 80)
    max_passages: int = 4                   # distractors: 2..max_passages passages
    questions: tuple[int, int] = (1, 4)     # Q/A lines per document
    closed_book_share: float = 0.3          # documents that also ask a core Q/A fact
    needle_tokens: tuple[int, int] = (160, 256)
    context_loss: bool = True               # loss on the context too, not only the answers
    # Attributes a passage states (0 = all of its domain's); questions ask only those. One
    # is the easiest reading: the passage is the asked attribute's statement(s).
    passage_attributes: int = 0
    # Curriculum: the first ``warmup_steps`` steps draw only reading documents of
    # ``warmup_kinds``; dense copying (``stated``) forms induction heads within hundreds of
    # steps, where the full mix leaves a small model at chance for thousands (docs/sandbox.md).
    warmup_steps: int = 0
    warmup_kinds: tuple[tuple[str, float], ...] = (("stated", 1.0),)
    # Then the world's documents come in over ``ramp_steps`` (their probability rising
    # linearly to ``1 - share``): switched on at once, they unlearned the copying (100% ->
    # 51% stated in 400 steps).
    ramp_steps: int = 0
    # Weight of each world-corpus token in the loss, an answer token's being 1: beside the
    # world from the first step, answers are about one loss token in five and reading did
    # not start (row r4, docs/sandbox.md); a weight below 1 gives them more of the gradient.
    world_weight: float = 1.0
    # Questions a needle document asks (the first its own; then, in a random order, the other
    # keys' values of a multi-key haystack, the decoy chain of a variable-tracking one):
    # open-book reading started with 4-8 questions a passage (row r3).
    needle_questions: int = 1

    def __post_init__(self):
        if not 0.0 <= self.share <= 1.0 or not 0.0 <= self.closed_book_share <= 1.0:
            raise ValueError("reading shares must lie in [0, 1]")
        for kinds in (self.kinds, self.warmup_kinds):
            bad = [k for k, _ in kinds if k not in KINDS_OF_READING]
            if bad or not kinds or any(w < 0 for _, w in kinds):
                raise ValueError(f"reading kinds must be some of {KINDS_OF_READING} with "
                                 f"weights >= 0, not {kinds}")
        if self.needle_questions < 1:
            raise ValueError("needle_questions must be >= 1")
        if not self.world_weight > 0.0:
            raise ValueError("world_weight must be > 0")
        if self.max_passages < 2 or not 1 <= self.questions[0] <= self.questions[1]:
            raise ValueError("distractors need max_passages >= 2 and questions (least, most) "
                             ">= 1")


def made_up_entity(world: World, domain: Domain, rng: random.Random, taken: set[str]) -> Entity:
    """An entity of ``domain`` with a fresh name (none of ``taken``) and random values."""
    name = entity_name(KINDS[domain.name], rng)
    while name in taken:
        name = entity_name(KINDS[domain.name], rng)
    taken.add(name)
    values = {a.name: rng.choice([v for v in a.values if v != name]) if a.closed
              else person_name(rng) for a in domain.attributes}
    return Entity(f"made-up.{domain.name}", name, domain.name, "made-up", 0, 0, "", False, values)


def training_passage(e: Entity, domain: Domain, rng: random.Random,
                     attributes: list[Attribute] | None = None) -> str:
    """A passage like :func:`plasticlm.sandbox.passages.passage_text` (one statement per
    attribute and two more, shuffled) that never uses an attribute's last paraphrase; with
    ``attributes``, only theirs."""
    attributes = domain.attributes if attributes is None else attributes
    picks = [(a, s) for a in attributes for s in [rng.choice(a.statements[:-1])]]
    pool = [(a, s) for a in attributes for s in a.statements[:-1] if (a, s) not in picks]
    picks += rng.sample(pool, min(2, len(pool)))
    rng.shuffle(picks)
    return rng.choice(_INTROS).format(e=e.name) + " ".join(
        render(s, e, e.attributes[a.name]) for a, s in picks)


def heldout_passage(e: Entity, domain: Domain) -> str:
    """Each attribute stated once in its last paraphrase, the one reading documents never
    use: a probe of reading on held-out phrasings."""
    return " ".join(render(a.statements[-1], e, e.attributes[a.name]) for a in domain.attributes)


def _qa(question: str, answer: str) -> list[Segment]:
    return [Segment(qa_prompt(question), False), Segment(qa_continuation(answer), True),
            Segment(".\n", False)]


def _ask(e: Entity, a: Attribute) -> list[Segment]:
    return _qa(a.question.format(e=e.name), e.attributes[a.name])


def _entity_docs(world: World, mix: ReadingMix, kind: str, rng: random.Random,
                 taken: set[str]) -> list[Segment]:
    d = rng.choice(world.domains)
    if kind == "distractors":
        n = rng.randint(2, mix.max_passages)
        doms = [d if rng.random() < 0.5 else rng.choice(world.domains) for _ in range(n)]
    else:
        doms = [d]
    ents = [(made_up_entity(world, x, rng, taken), x) for x in doms]
    if kind == "stated":
        e, x = ents[0]
        a = rng.choice(x.attributes)
        stated = qa_line(a.question.format(e=e.name), e.attributes[a.name])
        return [Segment(stated + "\n", False)] + _ask(e, a)
    k = mix.passage_attributes
    stated = [(e, x, rng.sample(x.attributes, k) if 0 < k < len(x.attributes) else x.attributes)
              for e, x in ents]
    text = "\n".join(training_passage(e, x, rng, attrs) for e, x, attrs in stated)
    segs = [Segment(text + "\n", False)]
    words = rng.randint(*mix.filler_words)
    if words > 0:
        segs.append(Segment(filler_text(words, rng) + "\n", False))
    for _ in range(rng.randint(*mix.questions)):
        e, _, attrs = rng.choice(stated)
        segs += _ask(e, rng.choice(attrs))
    return segs


def _needle_doc(task: str, mix: ReadingMix, sentences: list[str], tokenizer,
                rng: random.Random) -> list[Segment]:
    length, seed, depth = rng.randint(*mix.needle_tokens), rng.randrange(1 << 30), rng.random()
    for _ in range(8):
        try:
            s = generate_niah(task, 1, length, sentences, seed=seed, tokenizer=tokenizer,
                              depths=(depth,))[0]
            segs = [Segment(s.prompt, False), Segment(s.target, True)]
            if mix.needle_questions > 1:
                more = _needle_questions(s)
                rng.shuffle(more)
                for question, answer in more[:mix.needle_questions - 1]:
                    segs += [Segment(f"\n{question}\nAnswer:", False),
                             Segment(f" {answer}.", True)]
            return segs
        except PlasticError:
            # a coarse tokenizer (bpe768) needs more tokens for the needles and question
            length += 32
    raise PlasticError(f"no {task} needle fits in {length} tokens of this tokenizer; raise "
                       "ReadingMix.needle_tokens")


def _needle_questions(s) -> list[tuple[str, str]]:
    """The other questions a needle sample's context answers: each other key's value
    (multi-key), the decoy chain (variable tracking)."""
    if s.task == "multikey":
        pairs = re.findall(r"One of the special magic numbers for (\S+) is: (\d+)\.", s.context)
        return [(s.question.replace(s.question.split(" for ")[1].split(" mentioned")[0], k), v)
                for k, v in pairs if v not in s.answers]
    values = dict(re.findall(r"VAR ([A-Z]{3}) = (\d+)\.", s.context))
    links = re.findall(r"VAR ([A-Z]{3}) = VAR ([A-Z]{3})\.", s.context)
    out = []
    for var, value in values.items():
        if var in s.answers:
            continue
        chain = [var]
        while nxt := [a for a, b in links if b == chain[-1]]:
            chain.append(nxt[0])
        out.append((re.sub(r"the value \d+", f"the value {value}", s.question), ", ".join(chain)))
    return out


def reading_document(world: World, mix: ReadingMix, rng: random.Random, sentences: list[str],
                     tokenizer, closed_book: list[tuple[str, str]]) -> list[Segment]:
    """One fresh reading document drawn from ``rng``: a kind of ``mix.kinds`` (needle kinds
    use ``sentences`` as haystack, measured in ``tokenizer`` tokens) and, with
    ``mix.closed_book_share``, one ``(question, answer)`` of ``closed_book`` asked at the end
    (answered from memory)."""
    names, weights = zip(*mix.kinds)
    kind = rng.choices(names, weights)[0]
    if kind in ("multikey", "vartrack"):
        segs = _needle_doc(kind, mix, sentences, tokenizer, rng) + [Segment("\n", False)]
    else:
        segs = _entity_docs(world, mix, kind, rng, {e.name for e in world.entities})
    if closed_book and rng.random() < mix.closed_book_share:
        segs += _qa(*rng.choice(closed_book))
    return segs


def closed_book_pairs(world: World) -> list[tuple[str, str]]:
    """``(question, answer)`` of every core entity whose Q/A lines the corpus holds (the
    ``dev`` split's entities): closed-book questions that are no held-out evaluation."""
    by_name = {d.name: d for d in world.domains}
    return [(a.question.format(e=e.name), e.attributes[a.name]) for e in world.entities
            if e.role == "core" and e.qa_in_corpus for a in by_name[e.domain].attributes]


def document_drawer(world: World, mix: ReadingMix, sentences: list[str], tokenizer,
                    docs: list[str] | None = None):
    """``draw(rng, step)`` for :func:`plasticlm.models.pretrain.train_lm_segments`: with
    probability ``mix.share`` a reading document, else one of ``docs`` (default the world's
    training corpus) with its statements in a fresh order
    (:func:`plasticlm.sandbox.passages.shuffle_statements`), all of it in the loss (with
    weight ``mix.world_weight`` when not 1); before ``mix.warmup_steps``, only reading
    documents of ``mix.warmup_kinds``."""
    closed = closed_book_pairs(world)
    docs = docs if docs is not None else world.train_docs
    warmup = replace(mix, kinds=mix.warmup_kinds, closed_book_share=0.0)

    def draw(rng: random.Random, step: int) -> list[tuple[str, bool]]:
        if step < mix.warmup_steps:
            segs = reading_document(world, warmup, rng, sentences, tokenizer, closed)
            return [(s.text, s.answer or mix.context_loss) for s in segs]
        ramp = min(1.0, (step - mix.warmup_steps + 1) / mix.ramp_steps) if mix.ramp_steps else 1.0
        if rng.random() < (1.0 - mix.share) * ramp:
            weight = True if mix.world_weight == 1.0 else mix.world_weight
            return [(shuffle_statements(docs[rng.randrange(len(docs))], rng), weight)]
        segs = reading_document(world, mix, rng, sentences, tokenizer, closed)
        return [(s.text, s.answer or mix.context_loss) for s in segs]

    return draw
