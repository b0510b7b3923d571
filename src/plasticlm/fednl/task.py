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

import random
from dataclasses import dataclass, field

import torch

from plasticlm.data.niah import score
from plasticlm.data.records import MCQuestion
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
from plasticlm.eval.niah import niah_choice
from plasticlm.eval.prompts import context_prompt


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


@dataclass
class OpenBookTask(ClientTask):
    """An open-book client: ``train``/``test`` hold
    :class:`~plasticlm.data.context_tasks.OpenBookItem` about disjoint entities."""

    def item_pairs(self) -> list[tuple[str, str]]:
        return [(context_prompt(it.context, it.question), qa_continuation(it.choices[it.answer])) for it in self.train]

    def correct(self, model, tokenizer, batch_size: int = 16) -> list[float]:
        """Per held-out item, 4-way choice by log-likelihood (chance 0.25)."""
        return list(closed_set_accuracy(model, tokenizer, [context_prompt(it.context, it.question) for it in self.test],
                                        [list(it.choices) for it in self.test],
                                        [it.answer for it in self.test], batch_size).correct)

    def groups(self) -> list[str]:
        """The entity of each item: an entity's attributes are resampled together."""
        return [it.entity for it in self.test]


@dataclass
class LMTask:
    """A client of a user's own text (:mod:`plasticlm.data.text_sources`): trains on
    next-token loss over windows of its documents, and is evaluated by next-token accuracy on
    windows of documents it never trained on (a share in [0, 1] per window)."""

    name: str
    domain: str
    train: list[str] = field(repr=False)
    test: list[str] = field(repr=False)
    window: int = 128
    # training windows per tokenizer: each round would otherwise tokenize the documents again
    _runs: dict = field(default_factory=dict, repr=False, compare=False)

    def pairs(self) -> list[str]:
        """The training documents (what the client's reply is weighted by)."""
        return self.train

    def _train_windows(self, tokenizer) -> list[list[int]]:
        if id(tokenizer) not in self._runs:
            self._runs[id(tokenizer)] = self._windows(tokenizer, self.train)
        return self._runs[id(tokenizer)]

    def _windows(self, tokenizer, docs: list[str]) -> list[list[int]]:
        """``window + 1`` token runs of the documents, each document after BOS (EOS between
        them), packed and cut; a last short run is kept when it is all there is."""
        stream: list[int] = []
        bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
        for d in docs:
            ids = tokenizer(d, add_special_tokens=False)["input_ids"]
            stream += ([bos] if bos is not None else []) + ids + ([eos] if eos is not None else [])
        n = self.window + 1
        runs = [stream[i:i + n] for i in range(0, max(1, len(stream) - n + 1), n)]
        return [r for r in runs if len(r) >= 2]

    def batches(self, tokenizer, steps: int, batch_size: int, seed: int):
        """``steps`` batches of (input_ids [B, T], labels [B, T]): random windows, every
        token's next token in the loss (labels = ids; the model shifts them)."""
        runs = self._train_windows(tokenizer)
        rng = random.Random(seed)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        for _ in range(steps):
            chosen = [runs[rng.randrange(len(runs))] for _ in range(batch_size)]
            length = max(map(len, chosen))
            ids = torch.full((batch_size, length), pad)
            labels = torch.full((batch_size, length), -100)
            for i, r in enumerate(chosen):
                ids[i, : len(r)] = torch.tensor(r)
                labels[i, : len(r)] = torch.tensor(r)
            yield ids, labels

    @torch.no_grad()
    def correct(self, model, tokenizer) -> list[float]:
        """Per held-out window (each test document cut on its own), the share of its next
        tokens the model's top choice gets right; :meth:`groups` then names each window's
        document."""
        device = next(model.parameters()).device
        out, self._groups = [], []
        for d, doc in enumerate(self.test):
            for run in self._windows(tokenizer, [doc]):
                ids = torch.tensor([run], device=device)
                pred = model(input_ids=ids[:, :-1]).logits.argmax(-1)
                out.append(float((pred == ids[:, 1:]).float().mean()))
                self._groups.append(f"{self.name}/doc{d}")
        return out

    def groups(self) -> list[str]:
        """The document of each window :meth:`correct` last scored (resampled together)."""
        return list(getattr(self, "_groups", []))

    def accuracy(self, model, tokenizer) -> float:
        """Mean of :meth:`correct`."""
        scores = self.correct(model, tokenizer)
        return sum(scores) / len(scores)
