"""A generated world on disk: the real formats its loaders read, and ``world.json`` (config,
domains, entities, facts, question records) with the lookups built on it."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from plasticlm.data.corpus import write_text_corpus
from plasticlm.data.longbench import write_longbench
from plasticlm.data.mmlu import write_mmlu
from plasticlm.data.squad import write_squad
from plasticlm.data.streams import write_streams
from plasticlm.errors import PlasticError
from plasticlm.sandbox.world import WORLD_VERSION, World


def write_world(world: World, out: str | Path) -> Path:
    """Write the world under ``out`` in the real formats (see the module docstring)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_corpus(out / "corpus" / "train.txt", world.train_docs)
    write_text_corpus(out / "corpus" / "valid.txt", world.valid_docs)
    write_text_corpus(out / "corpus" / "specialist.txt", world.specialist_docs)
    write_mmlu(out / "mmlu", world.questions)
    write_mmlu(out / "specialist_mmlu", world.specialist_questions)
    write_squad(out / "squad" / "unseen.json", world.passages)
    write_longbench(out / "longbench" / "items.json", world.long_items)
    write_streams(out / "streams.jsonl", world.streams)
    index = {
        "version": WORLD_VERSION,
        "config": asdict(world.config),
        "domains": {d.name: {"client_domain": d.client_domain, "kind": d.kind,
                             "attributes": {a.name: {"values": list(a.values),
                                                     "closed": a.closed,
                                                     "question": a.question}
                                            for a in d.attributes}} for d in world.domains},
        "entities": [asdict(e) for e in world.entities],
        "facts": world.facts(),
        "questions": world.question_facts,
    }
    (out / "world.json").write_text(json.dumps(index, indent=1) + "\n")
    return out


def read_world_index(folder: str | Path) -> dict:
    """The ``world.json`` of a written world: config, domains, entities, facts, questions."""
    path = Path(folder) / "world.json"
    if not path.is_file():
        raise PlasticError(f"{folder} is not a sandbox world folder (no world.json); create one "
                           "with `plasticlm data world --seed S --out DIR`")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise PlasticError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None


def question_meta(index: dict, role: str = "core") -> dict[tuple[str, str, int], dict]:
    """``(subject, split, index) -> fact record`` for the MC questions of ``role``."""
    return {(q["subject"], q["split"], q["index"]): q for q in index["questions"]
            if q["role"] == role}


def closed_value_sets(index: dict) -> dict[tuple[str, str], tuple[str, ...]]:
    """``(domain, attribute) -> legal values`` of every closed attribute of a world index
    (:func:`read_world_index`); the legal-answer rate checks generations against these."""
    return {(d, a): tuple(spec["values"]) for d, dom in index["domains"].items()
            for a, spec in dom["attributes"].items() if spec.get("closed")}
