"""JSON and JSON-lines reading with errors that name the file and the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from plasticlm.errors import PlasticError


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path`` (a ``what`` file)."""
    path = Path(path)
    if not path.is_file():
        raise PlasticError(f"{what} file {path} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise PlasticError(f"{path}: not UTF-8 text (byte {e.start}); convert it to "
                           "UTF-8") from None


def parse_json(text: str, where: str):
    """``text`` as JSON. What no parser takes (bad syntax, nesting too deep, an integer of
    thousands of digits) is one error naming ``where``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PlasticError(f"{where}: not valid JSON (line {e.lineno}, column {e.colno}: "
                           f"{e.msg})") from None
    except (ValueError, RecursionError) as e:
        raise PlasticError(f"{where}: JSON that cannot be read ({str(e)[:120]})") from None


def read_json(path: str | Path, what: str):
    """The JSON document of ``path`` (a ``what`` file)."""
    return parse_json(read_text(path, what), str(path))


def read_jsonl(path: str | Path, what: str) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line of ``path`` (a ``what`` file); each
    line must hold a JSON object."""
    for n, line in enumerate(read_text(path, what).splitlines(), 1):
        if not line.strip():
            continue
        obj = parse_json(line, f"{path}, line {n}")
        if not isinstance(obj, dict):
            raise PlasticError(f"{path}, line {n}: expected a JSON object, got "
                               f"{type(obj).__name__}")
        yield n, obj
