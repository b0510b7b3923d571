"""JSON-lines reading with errors that name the file and the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from plasticlm.errors import PlasticError


def read_jsonl(path: str | Path, what: str) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line of ``path`` (a ``what`` file)."""
    path = Path(path)
    if not path.is_file():
        raise PlasticError(f"{what} file {path} does not exist")
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            raise PlasticError(f"{path}, line {n}: not valid JSON ({e.msg})") from None
