"""How the world's facts become text: statements, biographies, passages, Q/A lines, and the
fact-free filler of retrieval drills."""

from __future__ import annotations

import random
import re

from plasticlm.eval.prompts import qa_line, qa_prompt
from plasticlm.sandbox.domains import Domain, Entity

_FILLER_SUBJ = ("The old clock", "A small boat", "The morning bus", "Our neighbour", "The baker",
                "A grey cat", "The night train", "My cousin", "The school choir", "A tired farmer",
                "The postman", "The wind")


_FILLER_VERB = ("waited near", "passed by", "looked at", "walked past", "painted", "cleaned",
                "sang about", "forgot", "visited", "followed")


_FILLER_OBJ = ("the quiet harbour", "a wooden fence", "the empty market", "an old bridge",
               "the green hill", "a broken cart", "the long road", "the village well",
               "a red door", "the north field", "the stone wall")


_FILLER_TAIL = ("", " in the rain", " before noon", " every Sunday", " without a word",
                " after supper")


def filler_sentences(n: int, seed: int = 0) -> list[str]:
    """Plain everyday sentences with no world facts: the haystack of retrieval drills."""
    rng = random.Random(seed)
    return [f"{rng.choice(_FILLER_SUBJ)} {rng.choice(_FILLER_VERB)} {rng.choice(_FILLER_OBJ)}"
            f"{rng.choice(_FILLER_TAIL)}." for _ in range(n)]


def render(template: str, e: Entity, v: str) -> str:
    """One statement: ``template`` with the entity's name and value ``v``."""
    s = template.format(e=e.name, v=v)
    # Names keep their own case (libraries are lower-case); only other openings are raised.
    return s if template.startswith("{e}") else s[0].upper() + s[1:]


def biography(e: Entity, domain: Domain, rng: random.Random, extra: int = 1,
              closed_only: bool = False) -> str:
    """One statement per attribute (per closed attribute with ``closed_only``) plus
    ``extra`` more paraphrases, in random order."""
    attrs = domain.closed_attributes if closed_only else domain.attributes
    picks = [(a, rng.choice(a.statements)) for a in attrs]
    pool = [(a, s) for a in attrs for s in a.statements if (a, s) not in picks]
    picks += rng.sample(pool, min(extra, len(pool)))
    rng.shuffle(picks)
    return " ".join(render(s, e, e.attributes[a.name]) for a, s in picks)


def shuffle_statements(doc: str, rng: random.Random) -> str:
    """A one-line corpus document (a biography: statements in no meaningful order) with its
    sentences in a new order drawn from ``rng``; documents of several lines (Q/A blocks,
    retrieval drills) are returned as they are. Pre-training on fresh orders
    (:func:`plasticlm.models.train_lm_repacked`) varies what a small model memorises of a
    corpus it sees a dozen times (docs/sandbox.md)."""
    if "\n" in doc:
        return doc
    sentences = re.split(r"(?<=\.) ", doc)
    rng.shuffle(sentences)
    return " ".join(sentences)


_INTROS = ("", "", "From the archive: ", "A short note on {e}. ", "About {e}: ",
           "The record of {e} reads as follows. ", "Here is what is known of {e}. ")


def passage_text(e: Entity, domain: Domain, rng: random.Random) -> str:
    """A SCoL/open-book passage: an optional opening, one statement per attribute and two
    more paraphrases, shuffled (so that passages do not share one layout)."""
    return rng.choice(_INTROS).format(e=e.name) + biography(e, domain, rng, extra=2)


def qa_block(e: Entity, domain: Domain, rng: random.Random, closed_only: bool = False) -> str:
    """Q/A lines (:func:`plasticlm.eval.prompts.qa_line`) for every attribute, shuffled."""
    attrs = list(domain.closed_attributes if closed_only else domain.attributes)
    rng.shuffle(attrs)
    return "\n".join(qa_line(a.question.format(e=e.name), e.attributes[a.name]) for a in attrs)


def mc_prompt(question: str) -> str:
    """How a world question is put to a model; each choice is scored as `` <choice>``."""
    return qa_prompt(question)
