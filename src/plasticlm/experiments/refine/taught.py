"""The transfer rows whose transmitters were taught chosen facts (fact drills with corpus
replay, :func:`plasticlm.sandbox.teach_facts`): the oracle pair, privacy, the multi-party row
and Co-C2C between two halves. Each taught model is saved once under ``run/taught/NAME``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

from plasticlm.eval import qa_continuation, qa_prompt
from plasticlm.experiments.refine.ladder import (
    Ladder,
    TransferConfig,
    entity_of,
    score_both,
    score_items,
)
from plasticlm.experiments.refine.shipped_taught import copy_shipped, shipped_taught
from plasticlm.models import load_causal_lm
from plasticlm.models.pretrain import evaluate_loss, pack_corpus
from plasticlm.refine.fedrefine import FedRefine
from plasticlm.refine.fusers.objectives import needs_teacher
from plasticlm.refine.leakage import learned_inversion
from plasticlm.refine.link import Link
from plasticlm.refine.modes import RefineConfig
from plasticlm.refine.peer import Peer, load_peer, resolve_model
from plasticlm.refine.rephrase import rule_rephrase
from plasticlm.runtime import pick_dtype
from plasticlm.sandbox import teach_facts
from plasticlm.sandbox.pretrain import save_model_atomic

log = logging.getLogger("plasticlm.refine")


def teaching_key(spec: str, facts: list[tuple[str, str]], cfg: TransferConfig) -> str:
    """What a taught model depends on: the base model's spec, the facts and the drills."""
    return hashlib.sha256(json.dumps({"spec": spec, "facts": facts, "steps": cfg.teach_steps,
                                      "lr": cfg.teach_lr, "replay": cfg.teach_replay},
                                     sort_keys=True).encode()).hexdigest()


def taught_peer(run: Path, spec: str, name: str, facts: list[tuple[str, str]],
                cfg: TransferConfig, corpus: list[str]) -> Peer:
    """``spec``'s model taught ``facts`` (prompt, answer) by drills, saved once in
    ``run/taught/name`` and reused while the facts and drill settings are the same (the
    shipped copy, :mod:`plasticlm.experiments.refine.shipped_taught`, when it was taught from the same
    weights); ``taught.json`` records the corpus loss before and after (did it keep the
    language?)."""
    folder = run / "taught" / name
    key = teaching_key(spec, facts, cfg)
    stamp = folder / "taught.json"
    kept = json.loads(stamp.read_text()) if stamp.exists() else {}
    # a copy of the shipped model does not count as taught here when teaching is asked for
    if kept.get("key") != key or (kept.get("shipped") and not cfg.shipped_taught):
        kept = {}
        shipped = (shipped_taught(name, key, Path(resolve_model(spec)[1]))
                   if cfg.shipped_taught else None)
        if shipped is not None:   # taught from these very weights with these facts: no drills
            copy_shipped(shipped, folder)
            kept = {"key": key}
            log.info("taught %r: the shipped copy (taught from the same weights and facts, "
                     "checked against its SHA-256 manifest)", name)
    if kept:
        model, tok = load_causal_lm(folder)
        return Peer(name, model, tok)
    peer = load_peer(spec, dtype="float32")  # taught in float32: small steps vanish in bf16
    blocks = pack_corpus(peer.tokenizer, corpus[:100], 128)[:32]
    before = evaluate_loss(peer.model, blocks)
    losses = teach_facts(peer.model, peer.tokenizer, facts, cfg.teach_steps, lr=cfg.teach_lr,
                         replay=corpus if cfg.teach_replay else None,
                         replay_batch=cfg.teach_replay, progress=cfg.progress)
    save_model_atomic(peer.model, peer.tokenizer, folder)
    stamp.write_text(json.dumps({"key": key, "first_loss": losses[0], "last_loss": losses[-1],
                                 "corpus_loss_before": before,
                                 "corpus_loss_after": evaluate_loss(peer.model, blocks)})
                     + "\n")
    return Peer(name, peer.model.to(pick_dtype()), peer.tokenizer)


class Facts:
    """Every specialist fact (dev, val and test questions) as drills, and the entities'
    split into ``k`` disjoint parts (entity ``i`` goes to part ``i % k``)."""

    def __init__(self, lad: Ladder):
        qs = lad.train_q + lad.test_q
        self.about = [entity_of(q.question) for q in qs]
        self.facts = [(qa_prompt(q.question), qa_continuation(q.answer_text.strip())) for q in qs]
        self.entities = sorted(set(self.about))
        self.groups = lad.groups

    def part(self, i: int, k: int) -> list[tuple[str, str]]:
        """The facts about part ``i`` of ``k``."""
        mine = set(self.entities[i::k])
        return [f for f, e in zip(self.facts, self.about) if e in mine]

    def owner(self, k: int) -> list[int]:
        """Per test item, the part its entity belongs to."""
        index = {e: i % k for i, e in enumerate(self.entities)}
        return [index[g] for g in self.groups]


def oracle_peer(lad: Ladder, facts: Facts) -> Peer:
    """The receiver taught every specialist fact, beside its alone row."""
    oracle = taught_peer(lad.run.path, lad.cfg.receiver, "oracle", facts.facts, lad.cfg,
                         lad.corpus)
    lad.once("transmitter alone, oracle", FedRefine(oracle), "alone")
    return oracle


def oracle_rows(lad: Ladder, oracle: Peer, general, task_cfg) -> None:
    """The oracle pair: general and task fusers from the oracle, each beside self-fusion
    trained the same way (the same model without the facts)."""
    cfg = lad.cfg
    lad.probe_pair("probe_oracle", oracle, lad.receiver)
    lad.single("c2c, general fuser, oracle", oracle, general, cfg.fuser)
    lad.single("self-fusion, general fuser, receiver", lad.receiver, general, cfg.fuser)
    oracle_task = lad.knows(oracle, "oracle knows")
    lad.single("c2c, task fuser, oracle", oracle, oracle_task, task_cfg)
    lad.single("self-fusion, task fuser, receiver", lad.receiver, oracle_task, task_cfg)


def private_rows(lad: Ladder, oracle: Peer, general) -> None:
    """Prefix fusion of the oracle reading the prompt vs reading a rephrasing (each fuser
    trained on its own kind of text), and a learned inversion of every transmitted layer."""
    cfg = lad.cfg
    if "inversion" not in lad.extra:
        prompts = [it.prompt for it in lad.test_items]
        texts = lad.corpus[: cfg.inversion_texts]
        attack = learned_inversion(oracle.model, oracle.tokenizer, texts, prompts,
                                   [rule_rephrase(x) for x in prompts])
        clear = [float(g in rule_rephrase(x)) for g, x in zip(lad.groups, prompts)]
        lad.extra["inversion"] = {"layers": [dataclasses.asdict(a) for a in attack],
                                  "public_texts": len(texts),
                                  "entity_name_in_clear": sum(clear) / len(clear)}
        lad.keep()
    prefix_cfg = dataclasses.replace(cfg.fuser, mode="prefix")
    lad.single("prefix c2c, general fuser, oracle", oracle, general, prefix_cfg)
    rephrased = [dataclasses.replace(ex, transmitter_text=rule_rephrase(ex.prompt))
                 for ex in general]
    lad.single("prefix c2c private (rephrased), general fuser, oracle", oracle, rephrased,
               dataclasses.replace(prefix_cfg, private=True), RefineConfig(private=True))


def teacher_of(lad: Ladder, facts: Facts, spec: str, name: str) -> Peer | None:
    """The teacher of a fuser into a receiver of ``spec`` when the objective needs one: that
    model taught every fact (what all transmitters together know); None otherwise."""
    if not needs_teacher(lad.cfg.fuser.objective):
        return None
    if spec == lad.cfg.receiver:
        return oracle_peer(lad, facts)
    return taught_peer(lad.run.path, spec, name, facts.facts, lad.cfg, lad.corpus)


def multi_rows(lad: Ladder, facts: Facts, general) -> None:
    """Heterogeneous parties each taught a disjoint part of the entities, fused together
    (and each alone), beside the same models untaught. A cache objective regresses toward the
    oracle's cache in both."""
    cfg = lad.cfg
    teacher = teacher_of(lad, facts, cfg.receiver, "oracle")
    k = len(cfg.parties)
    kinds = {"parties": [taught_peer(lad.run.path, spec, f"party-{i}", facts.part(i, k), cfg,
                                     lad.corpus) for i, spec in enumerate(cfg.parties)],
             "untaught": [load_peer(spec) for spec in cfg.parties]}
    for kind, peers in kinds.items():
        arch = [p.model.config.model_type for p in peers]
        labels = [f"multi x{k} (parallel), {kind}"] + \
                 [f"c2c via party {i} ({a}) only, {kind}" for i, a in enumerate(arch)]
        for i, p in enumerate(peers):
            lad.once(f"transmitter alone, party {i} ({arch[i]}), {kind}", FedRefine(p), "alone")

        def run_seed(seed: int, kind=kind, peers=peers, labels=labels):
            fusers, losses = lad.fit(kind, lad.receiver, peers, general, cfg.fuser, seed,
                                     teacher)
            links = [Link(p, f) for p, f in zip(peers, fusers)]
            got = {labels[0]: score_items(FedRefine(lad.receiver, links), lad.test_items,
                                          "multi", cfg.progress, labels[0], n=None)}
            for link, label in zip(links, labels[1:]):
                got[label] = score_items(FedRefine(lad.receiver, [link]), lad.test_items, "c2c",
                                         cfg.progress, label)
            return got, losses, [f.gates_on() for f in fusers]
        lad.seeded(labels, run_seed)
    lad.extra["party_of_item"] = facts.owner(k)


def co_c2c_rows(lad: Ladder, facts: Facts, general) -> None:
    """Co-C2C between the receiver taught half the entities and the control taught the
    other half; each party's control is itself alone. A cache objective regresses each
    direction toward its reader's model taught every fact."""
    cfg = lad.cfg
    teacher_a = teacher_of(lad, facts, cfg.receiver, "oracle")
    teacher_b = teacher_of(lad, facts, cfg.control, "control-oracle")
    a = taught_peer(lad.run.path, cfg.receiver, "half-0", facts.part(0, 2), cfg, lad.corpus)
    b = taught_peer(lad.run.path, cfg.control, "half-1", facts.part(1, 2), cfg, lad.corpus)
    lad.once("alone, co-party A (receiver taught half 0)", FedRefine(a), "alone")
    lad.once("alone, co-party B (control taught half 1)", FedRefine(b), "alone")
    labels = ["co-c2c, co-party A (receiver taught half 0)",
              "co-c2c, co-party B (control taught half 1)"]

    def run_co(seed: int):
        (f_ba,), loss_a = lad.fit("co-a", a, [b], general, cfg.fuser, seed, teacher_a)
        (f_ab,), loss_b = lad.fit("co-b", b, [a], general, cfg.fuser, seed, teacher_b)
        ours, theirs = score_both(FedRefine(a, [Link(b, f_ba)], reverse_fuser=f_ab),
                                  lad.test_items, cfg.progress, "co-c2c")
        return {labels[0]: ours, labels[1]: theirs}, loss_a + loss_b, \
            [f_ba.gates_on(), f_ab.gates_on()]
    lad.seeded(labels, run_co)
    lad.extra["half_of_item"] = facts.owner(2)

