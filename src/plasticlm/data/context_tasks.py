"""Open-book items and client streams: questions whose evidence lies earlier in the context,
as records and JSON-lines files.

The sandbox world writes them (:func:`plasticlm.sandbox.tasks.write_world_tasks`); FedNL's
open-book clients and the experiments read them. An item is asked as
:func:`plasticlm.eval.prompts.context_prompt` of its context and question.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from plasticlm.data.jsonl import read_jsonl
from plasticlm.errors import PlasticError


@dataclass(frozen=True)
class OpenBookItem:
    """``context`` = passage + filler; ask ``question`` after it and score each choice as
    `` <choice>``; ``answer`` is the index of the right choice."""

    id: str
    domain: str
    entity: str
    attribute: str
    closed: bool
    context: str
    question: str
    choices: tuple[str, ...]
    answer: int
    filler_words: int


@dataclass(frozen=True)
class StreamSegment:
    """One piece of a client stream: a passage (``kind="text"``) or a question about an
    entity whose passage came ``lag`` passages earlier (``kind="question"``)."""

    kind: str
    text: str
    entity: str = ""
    attribute: str = ""
    answer: str = ""
    choices: tuple[str, ...] = ()
    lag: int = 0


def write_openbook(path: str | Path, items: Sequence[OpenBookItem]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(x)) + "\n" for x in items))
    return path


def load_openbook(path: str | Path) -> list[OpenBookItem]:
    out = []
    for n, obj in read_jsonl(path, "open-book items"):
        try:
            out.append(OpenBookItem(**{**obj, "choices": tuple(obj["choices"])}))
        except (TypeError, KeyError) as e:
            raise PlasticError(f"{path}, line {n}: not an open-book item ({e})") from None
    return out


def write_client_streams(path: str | Path, streams: dict[str, list[StreamSegment]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"domain": k, "segments": [asdict(s) for s in v]}) + "\n"
                            for k, v in streams.items()))
    return path


def load_client_streams(path: str | Path) -> dict[str, list[StreamSegment]]:
    out = {}
    for n, obj in read_jsonl(path, "client streams"):
        try:
            out[obj["domain"]] = [StreamSegment(**{**s, "choices": tuple(s["choices"])})
                                  for s in obj["segments"]]
        except (TypeError, KeyError) as e:
            raise PlasticError(f"{path}, line {n}: not a client stream ({e})") from None
    return out
