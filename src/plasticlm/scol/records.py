"""SCoL's plain records, below everything that uses them: a context of a stream, its
closed-book questions, and a candidate's reward. Contexts, rewards, the accuracy matrix and
the inner loop all import them from here, so those modules never import each other for a
type."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Question:
    """A closed-book question about one context and its gold answers."""

    question: str
    answers: tuple[str, ...]
    legal: tuple[str, ...] = ()    # the closed set of legal answers; empty when open
    swapped: str = ""              # the same question about an unseen entity (a control)


@dataclass(frozen=True)
class Context:
    """One context of a stream and the closed-book questions about it (may be none)."""

    id: str
    text: str
    questions: tuple[Question, ...] = ()


@dataclass(frozen=True)
class Reward:
    """What a candidate earned: acquisition - lambda * forgetting = total."""

    acquisition: float
    forgetting: float
    total: float
