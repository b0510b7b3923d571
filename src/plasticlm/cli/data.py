"""``plasticlm data``: write the sandbox world, write NIAH samples, inspect data files."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from plasticlm.cli.options import (
    SEED,
    SIZE,
    add_config_options,
    add_option_config,
    load_from_args,
    non_empty,
)
from plasticlm.outputs import prepare_output


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="sandbox world, NIAH samples, inspect data files",
                       description="Generate the sandbox world or NIAH samples, or load a data "
                       "file with its loader and print counts.")
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")

    q = dsub.add_parser("world", help="write the sandbox world (corpus, MC, SQuAD, LongBench)",
                        description="Generate the fictional world from a seed and write it in "
                        "real dataset formats under --out.")
    q.add_argument("--seed", type=SEED, default=None, help="the world's seed (same as --set seed=N)")
    q.add_argument("--out", required=True)
    add_config_options(q, "plasticlm.sandbox.world:WorldConfig")  # --overwrite with it
    q.set_defaults(func=_world)

    q = dsub.add_parser("niah", help="write RULER-style needle-in-a-haystack samples (JSONL)",
                        description="Write NIAH samples of one task as JSON lines.")
    q.add_argument("--task", default="single",
                   help="single, multikey, multivalue, multiquery, uuid, numeric or vartrack")
    q.add_argument("--length", type=SIZE, default=1024,
                   help="prompt length in tokens of --tokenizer (whitespace words without one)")
    q.add_argument("--n", type=SIZE, default=10, help="number of samples")
    q.add_argument("--depth", type=float, action="append", default=None,
                   help="needle depth in [0, 1] (repeatable; default 0, .25, .5, .75, 1)")
    q.add_argument("--haystack", default=None, type=non_empty,
                   help="a folder of .txt essays, a world folder, or a text file "
                        "(default: world text of seed 0)")
    q.add_argument("--tokenizer", default=None, type=non_empty, help="tokenizer folder or model folder")
    q.add_argument("--seed", type=SEED, default=0)
    q.add_argument("--out", required=True)
    add_option_config(q)
    q.set_defaults(func=_niah)

    q = dsub.add_parser("inspect", help="load a data file with its loader and print counts",
                        description="Detect the format (MMLU folder, SQuAD JSON, LongBench JSON, "
                        "NIAH/streams JSONL, text corpus, haystack folder, world folder), load "
                        "it and print counts as JSON.")
    q.add_argument("path")
    q.set_defaults(func=_inspect)


def _world(args) -> int:
    from plasticlm.sandbox.tasks import write_world_tasks
    from plasticlm.sandbox.world import WorldConfig, generate_world
    from plasticlm.sandbox.world_index import write_world

    cfg = load_from_args(WorldConfig, args, [] if args.seed is None else [f"seed={args.seed}"])
    world = generate_world(cfg)
    out = write_world(world, prepare_output(args.out, "data", hint="give another --out"))
    write_world_tasks(world, out, seed=cfg.seed)
    print(json.dumps(_describe(out), indent=1))
    return 0


def _haystack_docs(path: str | None):
    from plasticlm.data.corpus import load_haystack, load_text_corpus

    if path is None:
        from plasticlm.sandbox.world import generate_world

        return generate_world().valid_docs
    p = Path(path)
    if (p / "world.json").exists():
        return load_text_corpus(p / "corpus" / "valid.txt")
    if p.is_dir():
        return load_haystack(p)
    return load_text_corpus(p)


def _niah(args) -> int:
    from plasticlm.data.niah import TASKS, generate_niah, haystack_sentences
    from plasticlm.data.niah_files import write_niah
    from plasticlm.errors import PlasticError

    if args.task not in TASKS:
        raise PlasticError(f"unknown NIAH task {args.task!r}; choose one of {', '.join(TASKS)}")
    if args.n < 1 or args.length < 1:
        raise PlasticError(f"--n and --length must be >= 1 (got {args.n}, {args.length})")
    if Path(args.out).exists() or Path(args.out).is_symlink():   # never replaced: not ours
        raise PlasticError(f"{args.out} exists; nothing was written: remove it or give "
                           "another --out")
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
        except (OSError, ValueError) as e:
            why = " ".join(str(e).split())[:300]   # transformers' messages span lines
            raise PlasticError(f"could not load a tokenizer from {args.tokenizer}: {why}") from None
    sentences = haystack_sentences(_haystack_docs(args.haystack))
    samples = generate_niah(args.task, args.n, args.length, sentences, seed=args.seed,
                            tokenizer=tokenizer, depths=args.depth)
    write_niah(args.out, samples)
    lengths = [s.length for s in samples]
    print(f"wrote {len(samples)} {args.task} samples to {args.out} "
          f"({min(lengths)}-{max(lengths)} {samples[0].unit})")
    return 0


def _describe(path: Path) -> dict:
    """Counts for whatever data ``path`` holds, loaded with the matching loader."""
    from plasticlm.data import (
        load_haystack,
        load_longbench,
        load_mmlu,
        load_niah,
        load_squad,
        load_streams,
        load_text_corpus,
    )
    from plasticlm.data.context_tasks import load_client_streams, load_openbook
    from plasticlm.data.mmlu import SPLITS
    from plasticlm.errors import PlasticError
    from plasticlm.sandbox.world_index import read_world_index

    if not path.exists():
        raise PlasticError(f"{path} does not exist")
    if path.is_dir():
        if (path / "world.json").exists():
            index = read_world_index(path)
            return {"format": "world", "path": str(path),
                    "entities": dict(Counter(e["role"] for e in index["entities"])),
                    "facts": len(index["facts"]),
                    "corpus_docs": {n: len(load_text_corpus(path / "corpus" / f"{n}.txt"))
                                    for n in ("train", "valid", "specialist")},
                    "mmlu": _describe(path / "mmlu"),
                    "specialist_mmlu": _describe(path / "specialist_mmlu"),
                    "squad": _describe(path / "squad" / "unseen.json"),
                    "longbench": _describe(path / "longbench" / "items.json"),
                    "streams": _describe(path / "streams.jsonl"),
                    "openbook_items": len(load_openbook(path / "openbook" / "items.jsonl")),
                    "client_streams": {k: sum(s.kind == "question" for s in v)
                                       for k, v in load_client_streams(
                                           path / "client_streams.jsonl").items()}}
        if any((path / s).is_dir() for s in SPLITS):
            out: dict = {"format": "mmlu", "path": str(path)}
            for s in SPLITS:
                if (path / s).is_dir():
                    qs = load_mmlu(path, s)
                    out[s] = {"questions": len(qs), "subjects": len({q.subject for q in qs})}
            return out
        docs = load_haystack(path)
        return {"format": "haystack", "path": str(path), "documents": len(docs),
                "words": sum(len(d.text.split()) for d in docs)}
    if path.suffix == ".txt":
        docs = load_text_corpus(path)
        return {"format": "text", "path": str(path), "documents": len(docs),
                "words": sum(len(d.text.split()) for d in docs)}
    if path.suffix == ".json":
        head = path.read_text(encoding="utf-8", errors="replace").lstrip()[:1]
        if head == "[":
            items = load_longbench(path)
            return {"format": "longbench", "path": str(path), "items": len(items),
                    "lengths": dict(Counter(i.length for i in items))}
        passages = load_squad(path)
        return {"format": "squad", "path": str(path), "passages": len(passages),
                "questions": sum(len(p.qas) for p in passages),
                "articles": len({p.title for p in passages})}
    if path.suffix == ".jsonl":
        first = next((ln for ln in path.read_text().splitlines() if ln.strip()), "{}")
        try:
            keys = set(json.loads(first))
        except json.JSONDecodeError:
            raise PlasticError(f"{path}, line 1: not valid JSON") from None
        if "items" in keys:
            streams = load_streams(path)
            return {"format": "streams", "path": str(path), "streams": len(streams),
                    "items": sum(len(s.items) for s in streams)}
        if "_id" in keys:
            items = load_longbench(path)
            return {"format": "longbench", "path": str(path), "items": len(items)}
        samples = load_niah(path)
        return {"format": "niah", "path": str(path), "samples": len(samples),
                "tasks": dict(Counter(s.task for s in samples))}
    raise PlasticError(f"{path}: unknown data format (expected an MMLU/haystack/world folder, "
                       ".txt, .json or .jsonl)")


def _inspect(args) -> int:
    print(json.dumps(_describe(Path(args.path)), indent=1))
    return 0
