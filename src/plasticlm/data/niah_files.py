"""NIAH samples on disk: JSON lines written by :func:`write_niah` and read back, each field
checked, by :func:`load_niah`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from plasticlm.data.jsonl import read_jsonl
from plasticlm.data.niah import TASKS, NIAHSample
from plasticlm.errors import PlasticError


def write_niah(path: str | Path, samples: Sequence[NIAHSample]) -> Path:
    """Write samples as JSON lines (fields of :class:`NIAHSample` plus ``prompt``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for s in samples:
            f.write(json.dumps({**asdict(s), "prompt": s.prompt}) + "\n")
    return path


def load_niah(path: str | Path) -> list[NIAHSample]:
    """Samples written by :func:`write_niah`; a malformed line is an error naming it."""
    out = []
    for n, obj in read_jsonl(path, "NIAH"):
        missing = [k for k in ("id", "task", "context", "question", "answers", "length", "depth")
                   if k not in obj]
        if missing:
            raise PlasticError(f"{path}, line {n}: missing field(s) {', '.join(missing)}")
        for key, kind in _FIELD_TYPES.items():
            value = obj.get(key)
            if key in obj and (not isinstance(value, kind) or isinstance(value, bool)):
                raise PlasticError(f"{path}, line {n}: field {key!r} is a "
                                   f"{type(value).__name__}, not a {kind[0].__name__}")
        if not all(isinstance(a, str) for a in obj["answers"]):
            raise PlasticError(f"{path}, line {n}: answers must be strings")
        if obj["task"] not in TASKS:
            raise PlasticError(f"{path}, line {n}: unknown task {obj['task']!r}")
        out.append(NIAHSample(**{k: v for k, v in obj.items() if k in _FIELD_TYPES}))
    return out


# what each field of a stored sample must be (a missing "unit" or "meta" takes its default)
_FIELD_TYPES = {"id": (str,), "task": (str,), "context": (str,), "question": (str,),
                "answers": (list,), "length": (int,), "depth": (int, float), "unit": (str,),
                "meta": (dict,)}
