"""SQuAD v1.1 JSON: ``{"version", "data": [{"title", "paragraphs": [{"context", "qas"}]}]}``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from plasticlm.data.jsonl import read_json
from plasticlm.data.records import QA, Answer, Passage
from plasticlm.errors import PlasticError


def _field(obj, key: str, kind: type | tuple[type, ...], where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise PlasticError(f"{where}: missing field {key!r}")
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise PlasticError(f"{where}.{key}: expected {' or '.join(k.__name__ for k in kinds)}, "
                           f"got {type(value).__name__}")
    return value


def load_squad(path: str | Path) -> list[Passage]:
    """Every paragraph of a SQuAD v1.1 file, with its questions and gold answer spans.

    Each answer span is checked against its context; a mismatch is an error naming the field.
    """
    path = Path(path)
    doc = read_json(path, "SQuAD")
    out = []
    for i, article in enumerate(_field(doc, "data", list, str(path))):
        where_a = f"{path}: data[{i}]"
        title = _field(article, "title", str, where_a)
        for j, para in enumerate(_field(article, "paragraphs", list, where_a)):
            where_p = f"{where_a}.paragraphs[{j}]"
            context = _field(para, "context", str, where_p)
            qas = []
            for k, qa in enumerate(_field(para, "qas", list, where_p)):
                where_q = f"{where_p}.qas[{k}]"
                answers = []
                for m, ans in enumerate(_field(qa, "answers", list, where_q)):
                    where_ans = f"{where_q}.answers[{m}]"
                    text = _field(ans, "text", str, where_ans)
                    start = _field(ans, "answer_start", int, where_ans)
                    if start < 0 or context[start : start + len(text)] != text:
                        raise PlasticError(f"{where_ans}: answer_start {start} does not point at "
                                           f"{text!r} in the context")
                    answers.append(Answer(text, start))
                if not answers:
                    raise PlasticError(f"{where_q}.answers: empty; SQuAD v1.1 questions need at "
                                       "least one answer")
                qas.append(QA(str(_field(qa, "id", (str, int), where_q)),
                              _field(qa, "question", str, where_q), tuple(answers)))
            out.append(Passage(title, context, tuple(qas)))
    return out


def write_squad(path: str | Path, passages: Sequence[Passage]) -> Path:
    """Write passages as one SQuAD v1.1 file, grouping consecutive passages by title."""
    data: list[dict] = []
    for p in passages:
        if not data or data[-1]["title"] != p.title:
            data.append({"title": p.title, "paragraphs": []})
        data[-1]["paragraphs"].append({
            "context": p.context,
            "qas": [{"id": q.id, "question": q.question,
                     "answers": [{"text": a.text, "answer_start": a.start} for a in q.answers]}
                    for q in p.qas],
        })
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": "1.1", "data": data}, indent=1) + "\n")
    return path
