"""Each client's task built from a data source: the sandbox world's or an MMLU folder's
questions split by domain or Dirichlet, NIAH clients from a haystack, open-book clients from
a world, with an optional share of closed-book questions mixed in."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

from plasticlm.data import partition
from plasticlm.data.context_tasks import load_openbook
from plasticlm.data.corpus import load_haystack, load_text_corpus
from plasticlm.data.mmlu import load_mmlu
from plasticlm.data.niah import TASKS, generate_niah, haystack_sentences
from plasticlm.data.records import MCQuestion
from plasticlm.data.text_sources import load_documents
from plasticlm.errors import PlasticError
from plasticlm.fednl.task import ClientTask, LMTask, NIAHTask, OpenBookTask
from plasticlm.models.specs import is_named_spec


def niah_tasks(source: str | Path, tokenizer, length: int = 192, train_per_client: int = 48,
               test_per_client: int = 12, seed: int = 0) -> list[NIAHTask]:
    """Seven clients, one NIAH task type each, haystacks from the world corpus (or a folder
    of essays), ``length`` tokens of ``tokenizer``."""
    folder = Path(source)
    docs = (load_text_corpus(folder / "corpus" / "valid.txt") if (folder / "world.json").exists()
            else load_haystack(folder))
    sentences = haystack_sentences(docs)
    tasks = []
    for c, task in enumerate(TASKS):
        train = generate_niah(task, train_per_client, length, sentences, seed=seed * 7 + c,
                              tokenizer=tokenizer)
        test = generate_niah(task, test_per_client, length, sentences,
                             seed=10_000 + seed * 7 + c, tokenizer=tokenizer)
        tasks.append(NIAHTask(task, task, train, test))
    return tasks


def openbook_tasks(world_dir: str | Path, max_train: int | None = None,
                   max_test: int | None = None, seed: int = 0) -> list[OpenBookTask]:
    """Five clients, one per world domain (non-IID: their own entity kinds, attributes and
    statement templates), from the world's ``openbook/items.jsonl``; the entities of each
    domain alternate between training and test, so every test item is about an entity the
    client never trained on."""
    path = Path(world_dir) / "openbook" / "items.jsonl"
    if not path.exists():
        raise PlasticError(f"{path} is missing: open-book clients need a sandbox world with its "
                           "tasks (plasticlm models pretrain --preset sandbox writes it)")
    mapping = world_domains(world_dir)
    tasks = []
    for domain in sorted(mapping):
        items = [it for it in load_openbook(path) if it.domain == domain]
        entities = sorted({it.entity for it in items})
        held_out = set(entities[1::2])
        train = [it for it in items if it.entity not in held_out]
        test = [it for it in items if it.entity in held_out]
        tasks.append(OpenBookTask(domain, mapping[domain], _cap(train, max_train, seed),
                                  _cap(test, max_test, seed + 1)))
    return tasks


def text_tasks(path: str | Path, num_clients: int, max_train: int | None = None,
               max_test: int | None = None, seed: int = 0, field: str = "text",
               window: int = 128) -> list[LMTask]:
    """``num_clients`` clients of a user's text file (.txt, .jsonl, .csv), its documents
    shuffled by ``seed`` and dealt out IID; each client holds out one document in ten (at
    least one) for its evaluation, and keeps at most ``max_train`` / ``max_test``."""
    docs = load_documents(path, field)
    if len(docs) < 2 * num_clients:
        raise PlasticError(f"{path}: {len(docs)} documents for {num_clients} clients; each "
                           "needs one to train on and one to be evaluated on")
    random.Random(seed).shuffle(docs)
    tasks = []
    for c in range(num_clients):
        mine = docs[c::num_clients]
        n_test = max(1, len(mine) // 10)
        tasks.append(LMTask(f"client{c}", "text", _cap(mine[n_test:], max_train, seed + c),
                            _cap(mine[:n_test], max_test, seed + c), window))
    return tasks


def _cap(items: list, n: int | None, seed: int) -> list:
    if n is None or len(items) <= n:
        return items
    return random.Random(seed).sample(items, n)


def with_closed_book(tasks: list[ClientTask], source: str | Path, share: float,
                     seed: int = 0) -> list[ClientTask]:
    """The same clients, each with closed-book questions (the pool's dev and val splits, in
    the pre-training template) making up ``share`` of its training pairs: a client of a world
    domain gets its domain's questions, any other client questions of every domain."""
    if not 0 <= share < 1:
        raise PlasticError(f"closed_book_share must be in [0, 1), not {share}")
    if share == 0:
        return tasks
    pool, _, mapping = load_pool(source)
    out = []
    for c, task in enumerate(tasks):
        own = [q for q in pool if mapping.get(q.subject) == task.domain] or pool
        n = max(1, round(len(task.train) * share / (1 - share)))
        out.append(dataclasses.replace(task, closed_book=_cap(own, n, seed * 100 + c)))
    return out


def has_closed_book_pool(data: str | Path) -> bool:
    """Whether a run's ``data`` (a sandbox preset name or a folder) holds closed-book
    questions: a sandbox world or an MMLU folder, not a folder of essays."""
    return is_named_spec(str(data)) or _pool_kind(Path(data)) is not None


def _pool_kind(folder: Path) -> str | None:
    """"world" (a sandbox world), "mmlu" (dev/ val/ test/ of CSVs) or None."""
    if (folder / "world.json").exists():
        return "world"
    return "mmlu" if (folder / "test").is_dir() else None


def closed_book_test(source: str | Path, max_test: int | None = None,
                     seed: int = 0) -> ClientTask:
    """The pool's held-out closed-book questions (its ``test`` split) as one task: what a
    retrieval-trained model keeps of its short-context ability."""
    _, test, _ = load_pool(source)
    return ClientTask("closed-book", "all", [], _cap(test, max_test, seed))


def world_domains(world_dir: str | Path) -> dict[str, str]:
    """Sandbox world subject -> FedNL client domain, from the world's ``world.json``."""
    index = json.loads((Path(world_dir) / "world.json").read_text())
    return {name: d["client_domain"] for name, d in index["domains"].items()}


def load_pool(source: str | Path) -> tuple[list[MCQuestion], list[MCQuestion], dict[str, str]]:
    """(train pool, test pool, subject -> client domain) from a world or an MMLU folder.

    Train: the ``dev`` and ``val`` splits; test: the ``test`` split.
    """
    folder = Path(source)
    kind = _pool_kind(folder)
    if kind == "world":
        mapping, mmlu = world_domains(folder), folder / "mmlu"
    elif kind == "mmlu":
        mapping, mmlu = partition.MMLU_CLIENT_DOMAIN, folder
    else:
        raise PlasticError(f"{folder} is neither a sandbox world (world.json) nor an MMLU folder "
                           "(dev/ val/ test/ of CSVs)")
    train = load_mmlu(mmlu, "dev") + load_mmlu(mmlu, "val")
    return train, load_mmlu(mmlu, "test"), mapping


def client_tasks(source: str | Path, split: str = "domain", num_clients: int = 5,
                 alpha: float = 0.5, max_train: int | None = None, max_test: int | None = None,
                 seed: int = 0) -> list[ClientTask]:
    """Non-IID clients over a world or MMLU folder.

    ``split="domain"``: one client per FedNL domain (stem, math_cs, humanities,
    social_sciences, other). ``split="dirichlet"``: ``num_clients`` clients whose domain
    proportions are drawn from Dir(``alpha``); a client's ``domain`` is its majority domain.
    """
    if split == "niah":
        raise PlasticError("NIAH clients need the tokenizer: use niah_tasks(source, tokenizer)")
    if split == "openbook":
        return openbook_tasks(source, max_train, max_test, seed)
    train, test, mapping = load_pool(source)
    if split == "domain":
        tr = partition.partition_by_domain([q.subject for q in train], mapping)
        te = partition.partition_by_domain([q.subject for q in test], mapping)
        names = list(partition.CLIENT_DOMAINS)
        domains = names
    elif split == "dirichlet":
        labels_tr = [mapping[q.subject] for q in train]
        labels_te = [mapping[q.subject] for q in test]
        tr = partition.partition_dirichlet(labels_tr, num_clients, alpha, seed, min_size=4)
        te = partition.partition_dirichlet(labels_te, num_clients, alpha, seed, min_size=4)
        names = [f"client{c}" for c in range(num_clients)]
        domains = [max(set(labels_tr[i] for i in part), key=[labels_tr[i] for i in part].count)
                   for part in tr]
    else:
        raise PlasticError(f"unknown split {split!r}; use 'domain', 'dirichlet', 'niah' or "
                           "'openbook'")
    tasks = []
    for c, name in enumerate(names):
        if not tr[c] or not te[c]:
            raise PlasticError(f"client {name} has no {'training' if not tr[c] else 'test'} "
                               f"questions in {source}")
        tasks.append(ClientTask(name, domains[c], _cap([train[i] for i in tr[c]], max_train, seed),
                                _cap([test[i] for i in te[c]], max_test, seed + 1)))
    return tasks
