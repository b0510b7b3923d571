"""Ordered streams of contexts, one JSON line per stream: ``{"id", "kind", "items"}``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from plasticlm.data.jsonl import read_jsonl
from plasticlm.data.records import Stream
from plasticlm.errors import PlasticError


def write_streams(path: str | Path, streams: Sequence[Stream]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": s.id, "kind": s.kind, "items": s.items}) + "\n"
                            for s in streams))
    return path


def load_streams(path: str | Path) -> list[Stream]:
    """Streams from a JSON-lines file; ``items`` name records (e.g. SQuAD passage titles)."""
    out = []
    for n, obj in read_jsonl(path, "streams"):
        for key, kind in (("id", str), ("kind", str), ("items", list)):
            if not isinstance(obj.get(key), kind):
                raise PlasticError(f"{path}, line {n}: field {key!r} missing or not a "
                                   f"{kind.__name__}")
        out.append(Stream(obj["id"], obj["kind"], [str(x) for x in obj["items"]]))
    return out
