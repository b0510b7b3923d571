"""Typed records that every loader returns and every writer accepts."""

from __future__ import annotations

from dataclasses import dataclass, field

LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class MCQuestion:
    """One four-option multiple-choice question (MMLU row); ``answer`` is a letter A-D."""

    subject: str
    split: str
    question: str
    choices: tuple[str, str, str, str]
    answer: str
    index: int = 0

    @property
    def answer_index(self) -> int:
        return LETTERS.index(self.answer)

    @property
    def answer_text(self) -> str:
        return self.choices[self.answer_index]


@dataclass(frozen=True)
class Answer:
    """A gold answer span: ``context[start : start + len(text)] == text``."""

    text: str
    start: int


@dataclass(frozen=True)
class QA:
    id: str
    question: str
    answers: tuple[Answer, ...]


@dataclass(frozen=True)
class Passage:
    """A SQuAD paragraph with its questions (``title`` is the article it belongs to)."""

    title: str
    context: str
    qas: tuple[QA, ...]


@dataclass(frozen=True)
class LongItem:
    """A LongBench v2 item: a long ``context`` and a four-option question about it."""

    id: str
    domain: str
    sub_domain: str
    difficulty: str
    length: str
    question: str
    choices: tuple[str, str, str, str]
    answer: str
    context: str


@dataclass(frozen=True)
class Document:
    """A plain-text document (a story, an essay) and where it came from."""

    text: str
    source: str = ""


@dataclass
class Stream:
    """An ordered sequence of contexts, named by the ids of the records it visits."""

    id: str
    kind: str
    items: list[str] = field(default_factory=list)
