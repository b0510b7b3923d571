"""What general (non-task) fusers train on: the world's general corpus, the specialist's
own-domain corpus with every document naming an evaluation entity left out, or half of each.
Shared by the ladder (rungs e, f, g) and the transfer experiment's multi-party and Co-C2C
rows, so both train the same recipe on the same text."""

from __future__ import annotations

import re
from typing import Literal

from plasticlm.data.corpus import load_text_corpus
from plasticlm.errors import PlasticError
from plasticlm.experiments.refine.experiment import sandbox_world_of
from plasticlm.refine.examples import Example, general_examples

TrainText = Literal["general", "domain", "general+domain"]


def domain_texts(receiver: str, held_out: set[str]) -> list[str]:
    """The specialist's corpus of ``receiver``'s sandbox world, every document naming an
    entity of ``held_out`` (the evaluation entities) left out."""
    path = sandbox_world_of(receiver) / "corpus" / "specialist.txt"
    if not path.exists():
        raise PlasticError(f"train_text=domain needs the specialist's corpus ({path})")
    return [d.text for d in load_text_corpus(path)
            if not held_out & set(re.findall(r"[A-Z][\w'-]*", d.text))]


def training_examples(kind: TrainText, n: int, corpus: list[str], receiver: str,
                      held_out: set[str]) -> list[Example]:
    """``n`` context -> continuation examples of ``kind`` (half and half for
    ``general+domain``)."""
    if kind == "general":
        return general_examples(corpus, n)
    domain = domain_texts(receiver, held_out)
    if kind == "domain":
        return general_examples(domain, n)
    return general_examples(corpus, n // 2) + general_examples(domain, n - n // 2)
