"""A user's own text as documents: a plain-text file (documents separated by
``<|endoftext|>``, as TinyStories ships), JSON Lines (a ``text`` field, or ``prompt`` and
``response``/``completion`` joined by a newline, the instruction-tuning layouts) or CSV (a
``text`` column). Every problem is refused in one line naming the file and the line."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from plasticlm.data.corpus import load_text_corpus
from plasticlm.data.jsonl import read_jsonl, read_text
from plasticlm.errors import PlasticError

TEXT_SUFFIXES = (".txt", ".jsonl", ".csv")
ANSWER_FIELDS = ("response", "completion")


def is_text_source(path: str | Path) -> bool:
    """Whether ``path`` is a file of one of the text layouts (by its suffix)."""
    p = Path(path)
    return p.suffix.lower() in TEXT_SUFFIXES and p.is_file()


def load_documents(path: str | Path, field: str = "text") -> list[str]:
    """The documents of the text file at ``path`` (empty ones dropped)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in TEXT_SUFFIXES:
        raise PlasticError(f"{p}: a text source is a .txt, .jsonl or .csv file")
    if suffix == ".txt":
        docs = [d.text for d in load_text_corpus(p)]
    elif suffix == ".jsonl":
        docs = [_jsonl_text(obj, field, f"{p}, line {n}") for n, obj in read_jsonl(p, "JSONL")]
    else:
        reader = csv.DictReader(io.StringIO(read_text(p, "CSV")))
        if field not in (reader.fieldnames or []):
            raise PlasticError(f"{p}: no {field!r} column (columns: "
                               f"{', '.join(reader.fieldnames or []) or 'none'})")
        docs = [row[field] or "" for row in reader]
    docs = [d.strip() for d in docs if d and d.strip()]
    if not docs:
        raise PlasticError(f"{p}: holds no text")
    return docs


def _jsonl_text(obj: dict, field: str, where: str) -> str:
    if isinstance(obj.get(field), str):
        return obj[field]
    answer = next((obj[k] for k in ANSWER_FIELDS if isinstance(obj.get(k), str)), None)
    if isinstance(obj.get("prompt"), str) and answer is not None:
        return obj["prompt"] + "\n" + answer
    raise PlasticError(f"{where}: needs a string {field!r}, or 'prompt' and 'response' (or "
                       f"'completion'); has {', '.join(sorted(obj)) or 'no keys'}")
