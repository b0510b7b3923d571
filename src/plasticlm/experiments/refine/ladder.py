"""The state of one transfer run (``plasticlm refine experiment transfer``): its config, the
peers and held-out questions, the per-item scores kept in ``scores.json`` (so a rerun with the
same settings only runs what is missing), and the helpers every row uses to train fusers
over seeds and score them."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, get_args

from tqdm.auto import tqdm

from plasticlm.config import Field, configclass
from plasticlm.data.corpus import load_text_corpus
from plasticlm.errors import PlasticError
from plasticlm.eval import qa_continuation, qa_prompt
from plasticlm.experiments.refine.experiment import (
    ExperimentConfig,
    load_questions,
    sandbox_world_of,
)
from plasticlm.experiments.refine.probe import ProbeItem, probe_table
from plasticlm.experiments.refine.training_text import TrainText
from plasticlm.refine.examples import Example
from plasticlm.refine.fedrefine import FedRefine
from plasticlm.refine.fusers.objectives import needs_teacher
from plasticlm.refine.fusers.train import (
    FuserTrainConfig,
    loss_summary,
    prepare_examples,
    train_fusers,
)
from plasticlm.refine.link import Link
from plasticlm.refine.modes import RefineConfig
from plasticlm.refine.peer import Peer, load_peer
from plasticlm.runs import RunDir

log = logging.getLogger("plasticlm.refine")

Row = Literal["probe", "t2t", "general", "task", "task_fuse_last", "self", "draft", "oracle",
              "private", "multi", "co_c2c"]
ROWS = get_args(Row)


@configclass
class TransferConfig:
    """Sizes of the transfer experiment (loadable from TOML/YAML, key=value overrides)."""

    receiver: str = Field("sandbox:receiver", description="the receiver model")
    specialist: str = Field("sandbox:specialist", description="the transmitter that knows "
                            "the private facts")
    control: str = Field("sandbox:transmitter-llama", description="a transmitter of the "
                         "specialist's shape that knows no private fact")
    general_examples: int = Field(2000, gt=0, description="general (corpus) examples the "
                                  "general fusers train on")
    fuser: FuserTrainConfig = Field(default_factory=FuserTrainConfig,
                                    description="how every fuser trains")
    train_text: TrainText = Field("general", description="what general fusers train on: the "
                                  "world's general corpus, the specialist's own-domain corpus "
                                  "without any evaluation entity, or half of each")
    task_epochs: int = Field(4, gt=0, description="epochs of the task fusers")
    seeds: int = Field(3, gt=0, description="fuser training seeds per row")
    max_eval: int = Field(0, ge=0, description="test questions kept (0: the whole split)")
    max_task: int = Field(0, ge=0, description="task examples kept (0: every dev/val "
                          "question the transmitter answers correctly)")
    t2t_max_new_tokens: int = Field(8, ge=0, description="t2t: tokens of each background")
    draft_tokens: int = Field(3, ge=0, description="draft-only: tokens the transmitter "
                              "drafts and shares")
    teach_steps: int = Field(500, gt=0, description="fact drills that make the oracle and "
                             "the parties")
    teach_lr: float = Field(1e-3, gt=0, description="learning rate of the fact drills")
    teach_replay: int = Field(4, ge=0, description="blocks of the world's general corpus "
                              "replayed per drill step")
    shipped_taught: bool = Field(True, description="take the shipped taught oracle "
                                 "(plasticlm.experiments.refine.shipped_taught) when it was taught from "
                                 "the same weights, facts and drill settings; false teaches "
                                 "it here (about 2.5 min on 2 cores)")
    inversion_texts: int = Field(400, gt=0, description="public texts the inversion "
                                 "attacker trains on")
    parties: tuple[str, ...] = Field(
        ("sandbox:transmitter-llama", "sandbox:transmitter-qwen2", "sandbox:receiver"),
        description="multi: one transmitter per entry, each taught a disjoint part of the "
        "entities")
    rows: tuple[Row, ...] = Field(ROWS, description="which rows run (the receiver alone "
                                  "always does)")
    out: str = Field("runs/refine-transfer", description="run folder")
    progress: bool = Field(True, description="show progress bars and log rows")

    def __post_init__(self):
        taught_only = {"probe", "multi", "co_c2c"}
        if needs_teacher(self.fuser.objective) and not taught_only >= set(self.rows):
            raise PlasticError(f"fuser.objective={self.fuser.objective} needs a teacher; here "
                               f"only rows multi and co_c2c have one (the receiver taught "
                               f"every fact): set rows, or use `refine experiment ladder`")
        if "draft" in self.rows and self.draft_tokens < 1:
            raise PlasticError("the draft row needs draft_tokens >= 1 (the drafted tokens "
                               "are what is shared)")


def settings_key(cfg: TransferConfig) -> str:
    """The settings a stored score depends on (``rows``/``rungs``, ``seeds``, ``out`` and
    ``progress`` aside: more seeds or rows extend a run; nor ``shipped_taught``: the shipped
    oracle is the one taught here)."""
    kept = {k: v for k, v in dataclasses.asdict(cfg).items()
            if k not in ("rows", "rungs", "seeds", "out", "progress", "shipped_taught")}
    return json.dumps(kept, sort_keys=True, default=str)


def entity_of(question: str) -> str:
    """The entity a templated question is about: its first capitalised word after the first."""
    words = re.findall(r"\b[A-Z][\w'-]*", question)
    return words[1] if len(words) > 1 else question


def score_items(fr: FedRefine, items: list[ProbeItem], mode: str, progress: bool, label: str,
                n: int | None = 1) -> list[float]:
    """Per item, 1.0 when ``fr`` in ``mode`` picks the right choice."""
    return [float(fr.score(it.prompt, list(it.choices), mode, n).choice == it.answer)
            for it in tqdm(items, desc=label, disable=not progress, leave=False)]


def score_both(fr: FedRefine, items: list[ProbeItem], progress: bool, label: str
               ) -> tuple[list[float], list[float]]:
    """Co-C2C: (the receiver's, the partner's) correctness per item."""
    ours, theirs = [], []
    for it in tqdm(items, desc=label, disable=not progress, leave=False):
        s = fr.score(it.prompt, list(it.choices), "co-c2c")
        ours.append(float(s.choice == it.answer))
        theirs.append(float(s.partner_choice == it.answer))
    return ours, theirs


class Ladder:
    """One transfer run: peers, questions (``train_items`` from dev/val, ``test_items`` on
    held-out entities, ``groups`` their entities), stored ``scores`` per row label (one list
    of per-item scores per seed) and ``extra`` results (probes, training curves, gates)."""

    def __init__(self, cfg):  # TransferConfig, or rungs.LadderConfig
        self.cfg = cfg
        self.started = time.time()
        self.run = RunDir(Path(cfg.out))
        self.run.write_json("config.json", cfg)
        self.receiver, self.specialist, self.control = (
            load_peer(s) for s in (cfg.receiver, cfg.specialist, cfg.control))
        self.train_q, self.test_q, _ = load_questions(ExperimentConfig(
            receiver=cfg.receiver, train_splits=("dev", "val"), eval_splits=("test",),
            max_eval=cfg.max_eval))
        self.train_items = [ProbeItem(qa_prompt(q.question), tuple(q.choices), q.answer_index)
                            for q in self.train_q]
        self.test_items = [ProbeItem(qa_prompt(q.question), tuple(q.choices), q.answer_index)
                           for q in self.test_q]
        self.groups = [entity_of(q.question) for q in self.test_q]
        overlap = {entity_of(q.question) for q in self.train_q} & set(self.groups)
        if overlap:
            raise PlasticError(f"test entities also appear in training: {sorted(overlap)[:3]}")
        self.corpus = [d.text for d in load_text_corpus(
            sandbox_world_of(cfg.receiver) / "corpus" / "train.txt")]
        self.store = self.run.path / "scores.json"
        self.key = settings_key(cfg)
        saved = json.loads(self.store.read_text()) if self.store.exists() else {}
        same = saved.get("settings") == self.key
        self.scores: dict[str, list[list[float]]] = saved.get("scores", {}) if same else {}
        self.extra: dict = saved.get("extra", {}) if same else {}
        self.training = self.extra.setdefault("training", {})
        self.gates = self.extra.setdefault("gates_on", {})
        self._prepared: dict[str, list] = {}   # frozen models: one set of caches for all seeds

    def keep(self) -> None:
        """Write the scores so far (a killed run resumes from here)."""
        self.store.write_text(json.dumps({"settings": self.key, "scores": self.scores,
                                          "extra": self.extra}) + "\n")

    def probe_pair(self, key: str, knows: Peer, blank: Peer) -> None:
        """Linear probes of ``knows``'s and ``blank``'s prompt caches, stored once."""
        if key not in self.extra:
            a, b = (probe_table(peer, self.train_items, self.test_items)
                    for peer in (knows, blank))
            self.extra[key] = {f"{k[0]}|{k[1]}": [a[k], b[k]] for k in sorted(a)}
            self.keep()

    def once(self, label: str, fr: FedRefine, mode: str) -> None:
        """A row without trained parts: scored once, whatever the seeds."""
        if label not in self.scores:
            self.scores[label] = [score_items(fr, self.test_items, mode, self.cfg.progress,
                                              label)]
            self.keep()

    def knows(self, peer: Peer, label: str) -> list[Example]:
        """Task examples: the dev/val questions ``peer`` answers correctly alone."""
        right = score_items(FedRefine(peer), self.train_items, "alone", self.cfg.progress, label)
        return [Example(it.prompt, qa_continuation(it.choices[it.answer]))
                for it, ok in zip(self.train_items, right) if ok][: self.cfg.max_task or None]

    def fit(self, key: str, receiver: Peer, peers: list[Peer], examples: list[Example],
            fcfg: FuserTrainConfig, seed: int, teacher: Peer | None = None):
        """Fusers from each of ``peers`` into ``receiver``, trained together with ``seed``
        (toward ``teacher``'s cache when the objective has one); the frozen models' caches
        are prepared once per ``key``."""
        if key not in self._prepared:
            self._prepared[key] = [prepare_examples(receiver, p, examples, fcfg,
                                                    self.cfg.progress, teacher) for p in peers]
        return train_fusers(receiver, peers, examples, dataclasses.replace(fcfg, seed=seed),
                            progress=self.cfg.progress, prepared=self._prepared[key])

    def seeded(self, labels: list[str],
               run_seed: Callable[[int], tuple[dict, list[float], object]]) -> None:
        """Run ``run_seed(seed) -> ({label: scores}, losses, gates)`` for each missing seed."""
        for label in labels:
            for store in (self.scores, self.training, self.gates):
                store.setdefault(label, [])
        for seed in range(min(len(self.scores[label]) for label in labels), self.cfg.seeds):
            t0 = time.time()
            got, losses, gate = run_seed(seed)
            info = {"seconds": round(time.time() - t0, 1), **loss_summary(losses)}
            for label in labels:
                self.scores[label] = self.scores[label][:seed] + [got[label]]
                self.training[label] = self.training[label][:seed] + [info]
                self.gates[label] = self.gates[label][:seed] + [gate]
            self.keep()
            for label in labels:
                acc = sum(got[label]) / len(self.test_items)
                self.run.log(row=label, seed=seed, accuracy=acc, **info)
                if self.cfg.progress:
                    log.info("transfer %s, seed %d: %.1f%%", label, seed, 100 * acc)
        self._prepared.clear()

    def single(self, label: str, peer: Peer, examples: list[Example], fcfg: FuserTrainConfig,
               refine: RefineConfig | None = None) -> None:
        """A one-transmitter C2C row: a fuser from ``peer`` into the receiver per seed."""
        def run_seed(seed: int):
            fusers, losses = self.fit(label, self.receiver, [peer], examples, fcfg, seed)
            fr = FedRefine(self.receiver, [Link(peer, fusers[0])], refine)
            return ({label: score_items(fr, self.test_items, "c2c", self.cfg.progress, label)},
                    losses, fusers[0].gates_on())
        self.seeded([label], run_seed)
