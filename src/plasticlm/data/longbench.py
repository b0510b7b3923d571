"""LongBench v2 items: a JSON list (or JSON lines) of long-context multiple-choice questions."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from plasticlm.data.jsonl import read_json, read_jsonl
from plasticlm.data.records import LETTERS, LongItem
from plasticlm.errors import PlasticError

FIELDS = ("_id", "domain", "sub_domain", "difficulty", "length", "question",
          "choice_A", "choice_B", "choice_C", "choice_D", "answer", "context")
ANSWER_PATTERN = re.compile(r"The correct answer is \(?([A-D])\)?")


def _item(obj, where: str) -> LongItem:
    if not isinstance(obj, dict):
        raise PlasticError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in FIELDS:
        if key not in obj:
            raise PlasticError(f"{where}: missing field {key!r}")
        if not isinstance(obj[key], str):
            raise PlasticError(f"{where}.{key}: expected a string, got {type(obj[key]).__name__}")
    if obj["answer"] not in LETTERS:
        raise PlasticError(f"{where}.answer: {obj['answer']!r} is not one of A, B, C, D")
    return LongItem(obj["_id"], obj["domain"], obj["sub_domain"], obj["difficulty"],
                    obj["length"], obj["question"],
                    tuple(obj[f"choice_{x}"] for x in LETTERS), obj["answer"], obj["context"])


def load_longbench(path: str | Path) -> list[LongItem]:
    """LongBench v2 items from a ``.json`` list or a ``.jsonl`` file (one item a line)."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return [_item(obj, f"{path}, line {n}") for n, obj in read_jsonl(path, "LongBench")]
    doc = read_json(path, "LongBench")
    if not isinstance(doc, list):
        raise PlasticError(f"{path}: expected a JSON list of items, got {type(doc).__name__}")
    return [_item(obj, f"{path}: item [{i}]") for i, obj in enumerate(doc)]


def write_longbench(path: str | Path, items: Sequence[LongItem]) -> Path:
    """Write items as a LongBench v2 JSON list."""
    rows = [{"_id": it.id, "domain": it.domain, "sub_domain": it.sub_domain,
             "difficulty": it.difficulty, "length": it.length, "question": it.question,
             **{f"choice_{x}": c for x, c in zip(LETTERS, it.choices)},
             "answer": it.answer, "context": it.context} for it in items]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1) + "\n")
    return path


def extract_answer(response: str) -> str | None:
    """The letter in ``The correct answer is (X)``, LongBench v2's answer format, or None."""
    m = ANSWER_PATTERN.search(response)
    return m.group(1) if m else None
