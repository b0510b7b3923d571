"""Plain-text corpora (documents separated by ``<|endoftext|>``) and haystack folders."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from plasticlm.data.records import Document
from plasticlm.errors import PlasticError

SEPARATOR = "<|endoftext|>"


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise PlasticError(f"{path}: not UTF-8 text (byte {e.start}); convert it to UTF-8") from None


def load_text_corpus(path: str | Path, max_docs: int | None = None) -> list[Document]:
    """Documents of a text file split on ``<|endoftext|>``, stripped, empty ones dropped.

    A file without any separator is one document. ``max_docs`` keeps the first ones.
    """
    path = Path(path)
    if not path.is_file():
        raise PlasticError(f"text corpus {path} does not exist")
    parts = [p.strip() for p in _read_text(path).split(SEPARATOR)]
    docs = [Document(p, f"{path.name}#{i}") for i, p in enumerate(parts) if p]
    if not docs:
        raise PlasticError(f"{path}: holds no text")
    return docs[:max_docs] if max_docs else docs


def load_haystack(folder: str | Path) -> list[Document]:
    """Every ``*.txt`` file of ``folder`` (sorted by name) as one document."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PlasticError(f"haystack folder {folder} does not exist")
    paths = sorted(folder.glob("*.txt"))
    if not paths:
        raise PlasticError(f"haystack folder {folder} holds no .txt files")
    docs = []
    for p in paths:
        text = _read_text(p).strip()
        if not text:
            raise PlasticError(f"haystack file {p} is empty; remove it or fill it")
        docs.append(Document(text, p.name))
    return docs


def write_text_corpus(path: str | Path, texts: Sequence[str]) -> Path:
    """Write documents separated by ``<|endoftext|>`` lines (the TinyStories layout)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{t.strip()}\n{SEPARATOR}\n" for t in texts), encoding="utf-8")
    return path
