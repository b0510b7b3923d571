"""Client datasets for federated training, split non-IID.

Two kinds of client:
- knowledge (:class:`ClientTask`): multiple-choice questions; trains on (question, answer)
  pairs, evaluated by continuation scoring, both in the pre-training QA template
  (:mod:`plasticlm.eval.prompts`). The sandbox world's five domains map one-to-one
  onto FedNL's five client domains; a real MMLU folder is split by
  :data:`plasticlm.data.partition.MMLU_CLIENT_DOMAIN`; a Dirichlet split over the same pool
  gives any number of clients.
- retrieval (:class:`NIAHTask`): one NIAH task type per client (seven clients); trains on
  (haystack prompt, needle answer) pairs; evaluated by 4-way choice (the needle's first
  answer against three strings of the same format, chance 25%), exact greedy match
  secondary (:meth:`NIAHTask.exact_match`).
- open-book (:class:`OpenBookTask`): one client per world domain; an unseen entity's
  passage, filler, then a question beyond a short window; trains on half of the domain's
  unseen entities and is evaluated on the other half (held-out entities), by 4-way choice.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from plasticlm.data import partition
from plasticlm.data.corpus import load_haystack, load_text_corpus
from plasticlm.data.mmlu import load_mmlu
from plasticlm.data.niah import TASKS, generate_niah, haystack_sentences, score
from plasticlm.data.records import MCQuestion
from plasticlm.errors import PlasticError
from plasticlm.eval import (
    QA_TEMPLATE,
    MCConfig,
    closed_set_accuracy,
    encode_pair,
    evaluate_mc_items,
    generate_texts,
    qa_continuation,
    qa_prompt,
)
from plasticlm.sandbox import sandbox_preset_of
from plasticlm.sandbox.probes import niah_choice
from plasticlm.sandbox.tasks import load_openbook


def qa_pairs(questions: list[MCQuestion]) -> list[tuple[str, str]]:
    """(prompt, answer continuation) per question, in the pre-training QA template."""
    return [(qa_prompt(q.question), qa_continuation(q.answer_text)) for q in questions]


@dataclass
class ClientTask:
    """One client's data: what it trains on and what it is evaluated on."""

    name: str
    domain: str
    train: list[MCQuestion] = field(repr=False)
    test: list[MCQuestion] = field(repr=False)
    # closed-book questions mixed into a retrieval or open-book client's training, so that
    # learning to read far back does not cost the short-context ability (with_closed_book)
    closed_book: list[MCQuestion] = field(default_factory=list, repr=False)

    def pairs(self) -> list[tuple[str, str]]:
        """(prompt, answer continuation) for every training item, closed-book ones included."""
        return self.item_pairs() + qa_pairs(self.closed_book)

    def item_pairs(self) -> list[tuple[str, str]]:
        """(prompt, answer continuation) for every item of ``train``."""
        return qa_pairs(self.train)

    def batches(self, tokenizer, steps: int, batch_size: int, seed: int):
        """``steps`` batches of (input_ids [B,T], labels [B,T]); loss only on the answer."""
        rng = random.Random(seed)
        pairs = [encode_pair(tokenizer, p, a) for p, a in self.pairs()]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        for _ in range(steps):
            chosen = [pairs[rng.randrange(len(pairs))] for _ in range(batch_size)]
            length = max(len(c) + len(a) for c, a in chosen)
            ids = torch.full((batch_size, length), pad)
            labels = torch.full((batch_size, length), -100)
            for i, (c, a) in enumerate(chosen):
                seq = torch.tensor(c + a)
                ids[i, : len(seq)] = seq
                labels[i, len(c) : len(seq)] = torch.tensor(a)
            yield ids, labels

    def correct(self, model, tokenizer, batch_size: int = 32) -> list[float]:
        """1.0 / 0.0 per held-out question (multiple choice, continuation scoring)."""
        cfg = MCConfig(method="continuation", batch_size=batch_size,
                       continuation_template=QA_TEMPLATE)
        return [float(x) for x in evaluate_mc_items(model, tokenizer, self.test, cfg).correct]

    def groups(self) -> list[str]:
        """A label per held-out item: items sharing one are resampled together."""
        return [f"{q.subject}/{q.split}/{q.index}" for q in self.test]

    def accuracy(self, model, tokenizer) -> float:
        """Mean of :meth:`correct`."""
        scores = self.correct(model, tokenizer)
        return sum(scores) / len(scores)


@dataclass
class NIAHTask(ClientTask):
    """A retrieval client: ``train``/``test`` hold :class:`~plasticlm.data.niah.NIAHSample`."""

    max_new_tokens: int = 24

    def item_pairs(self) -> list[tuple[str, str]]:
        return [(s.prompt, s.target) for s in self.train]

    def correct(self, model, tokenizer) -> list[float]:
        """Per held-out sample, 4-way choice of the needle (chance 0.25)."""
        return niah_choice(model, tokenizer, self.test, seed=1)

    def groups(self) -> list[str]:
        return [s.id for s in self.test]

    def exact_match(self, model, tokenizer) -> float:
        """Mean exact score (:func:`plasticlm.data.niah.score`) of greedy answers."""
        total = 0.0
        for sample in self.test:
            total += score(sample, greedy_answer(model, tokenizer, sample.prompt,
                                                 self.max_new_tokens))
        return total / len(self.test)


def greedy_answer(model, tokenizer, prompt: str, max_new_tokens: int) -> str:
    """Greedy continuation up to a newline, by full forward passes (no KV cache), so that
    it works for any model, memory-augmented ones included."""
    return generate_texts(model, tokenizer, [prompt], max_new_tokens, batch_size=1,
                          stop=("\n",), use_cache=False)[0]


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


@dataclass
class OpenBookTask(ClientTask):
    """An open-book client: ``train``/``test`` hold
    :class:`~plasticlm.sandbox.tasks.OpenBookItem` about disjoint entities."""

    def item_pairs(self) -> list[tuple[str, str]]:
        return [(it.prompt, qa_continuation(it.choices[it.answer])) for it in self.train]

    def correct(self, model, tokenizer, batch_size: int = 16) -> list[float]:
        """Per held-out item, 4-way choice by log-likelihood (chance 0.25)."""
        return list(closed_set_accuracy(model, tokenizer, [it.prompt for it in self.test],
                                        [list(it.choices) for it in self.test],
                                        [it.answer for it in self.test], batch_size).correct)

    def groups(self) -> list[str]:
        """The entity of each item: an entity's attributes are resampled together."""
        return [it.entity for it in self.test]


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
    return bool(sandbox_preset_of(str(data))) or _pool_kind(Path(data)) is not None


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
