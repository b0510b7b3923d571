"""What fusers train on: an :class:`Example` is a prompt and the answer the receiver should
continue it with; general examples come from a world's text (as C2C pre-trains on general
data), task examples from questions."""

from __future__ import annotations

import random
from dataclasses import dataclass

from plasticlm.eval import qa_continuation
from plasticlm.refine.peer import Peer
from plasticlm.refine.rephrase import rephrase


@dataclass
class Example:
    """A prompt, the answer the receiver should continue it with, optionally the text the
    transmitter encodes instead of the prompt (a rephrasing), the answer choices of a
    multiple-choice item (``choice-kl`` matches the transmitter's distribution over them) and
    the entity the prompt asks about (``entity-cache`` regresses the cache at its tokens)."""

    prompt: str
    answer: str
    transmitter_text: str | None = None
    choices: tuple[str, ...] = ()
    entity: str | None = None


def general_examples(texts: list[str], n: int, seed: int = 0, max_answer_words: int = 12
                     ) -> list[Example]:
    """Up to ``n`` (context, continuation) examples from general documents: a Q/A line
    ``Q: ... A: x.`` gives prompt ``Q: ... A:`` and answer `` x``; a narrative document cut
    after a sentence gives the sentences so far and the start of the next sentence (at most
    ``max_answer_words`` words). Deterministic by ``seed``."""
    rng = random.Random(seed)
    out: list[Example] = []
    for text in texts:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if lines and all(ln.startswith("Q: ") and " A: " in ln for ln in lines):
            for ln in lines:
                question, _, answer = ln.partition(" A: ")
                out.append(Example(question + " A:", qa_continuation(answer.rstrip("."))))
            continue
        sentences = [x.strip() + "." for x in " ".join(lines).split(". ") if x.strip()]
        if len(sentences) < 2:
            continue
        cut = rng.randrange(1, len(sentences))
        nxt = sentences[cut].rstrip(".").split()[:max_answer_words]
        out.append(Example(" ".join(sentences[:cut]), " " + " ".join(nxt)))
    rng.shuffle(out)
    return out[:n]


def make_examples(items, prompt_fn, private: bool = False, rephraser: Peer | None = None
                  ) -> list[Example]:
    """Examples from MC records: prompt ``prompt_fn(question)``, answer `` <right choice>``;
    with ``private`` the transmitter text is the prompt rephrased."""
    out = []
    for q in items:
        prompt = prompt_fn(q.question)
        text = None
        if private:
            text = rephrase(prompt, rephraser.model if rephraser else None,
                            rephraser.tokenizer if rephraser else None)[0]
        out.append(Example(prompt, qa_continuation(q.answer_text.strip()), text,
                           tuple(str(c) for c in q.choices)))
    return out
