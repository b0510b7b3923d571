"""``plasticlm refine experiment transfer``: does a fuser carry what the transmitter knows to
entities no fuser was trained on, beyond what a transmitter that knows nothing gives?

On the sandbox: the receiver, the specialist (knows the private facts of the world's
specialist entities) and a control transmitter of the specialist's shape and tokenizer that
never saw a private fact (``sandbox:transmitter-llama``). Every question is scored as a 4-way
choice on the specialist's ``test`` split (entities disjoint from ``dev``/``val``, which the
task fusers train on). Rows, each beside its control:

- the probe gate (:mod:`plasticlm.refine.probe`): a linear probe from each transmitter's
  prompt cache, per layer and position, specialist minus control;
- alone (the receiver), and each transmitter alone;
- T2T: the transmitter writes a background line, the receiver reads it;
- C2C, general fuser: trained on the world's general material only (corpus continuations and
  core-entity Q/A lines, :func:`plasticlm.refine.train.general_examples`), as C2C pre-trains;
- C2C, task fuser: trained on the ``dev``/``val`` questions the specialist answers correctly
  (the same examples for the control, so only what the transmitter knows differs);
- C2C, task fuser with ``fuse_last`` (the ablation that also fuses the last prompt token);
- the ladder's self-fusion row: a general fuser from the receiver to itself (it must not
  hurt);
- C2C draft-only: a prefix fuser that shares only the cache of tokens the transmitter
  drafts after the prompt (text hand-off in cache form);
- the ladder's oracle pair: the receiver taught every specialist fact (the test entities'
  too) as transmitter, with a general fuser and with a task fuser (trained on the dev/val
  facts the oracle knows); each control is self-fusion with the same training (the same
  model without the facts);
- privacy done cleanly: prefix fusion of the oracle with the transmitter reading the prompt
  and reading a rephrasing (each fuser trained on its own kind of text, nothing else
  differs), and a learned inversion attack on every transmitted layer;
- multi-party with complementary knowledge: three heterogeneous transmitters (Llama, Qwen2,
  Qwen3) each taught a disjoint third of the entities, fusers trained together on random
  subsets (C2C's bitmask); the control is the same three models untaught;
- Co-C2C between two models each taught a disjoint half of the entities (the receiver's
  Qwen3 and the control's Llama); neither may end below its alone accuracy.

``rows`` picks which of these run. Per-item scores are kept in ``scores.json`` in the run
folder, so a rerun with the same settings (``rows`` aside) only runs what is missing.
Fusers train with ``seeds`` seeds; intervals are entity-clustered bootstrap intervals pooled
over seeds, differences paired on the same items.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from plasticlm.errors import PlasticError
from plasticlm.eval import CI, format_ci, pooled_bootstrap_ci, qa_continuation, qa_prompt
from plasticlm.refine.experiment import (
    ExperimentConfig,
    load_peer,
    load_questions,
    sandbox_world_of,
)
from plasticlm.refine.leakage import learned_inversion
from plasticlm.refine.modes import FedRefine, Link, Peer, RefineConfig
from plasticlm.refine.probe import ProbeItem, probe_table
from plasticlm.refine.rephrase import rule_rephrase
from plasticlm.refine.train import (
    Example,
    FuserTrainConfig,
    general_examples,
    prepare_examples,
    train_fusers,
)

PROBE_GATE_PP = 15.0      # the probe must beat the control's by this much at fused positions
ROWS = ("probe", "t2t", "general", "task", "task_fuse_last", "self", "draft", "oracle",
        "private", "multi", "co_c2c")


@dataclass
class TransferConfig:
    """Sizes of the transfer experiment (loadable from TOML/YAML, key=value overrides)."""

    receiver: str = "sandbox:receiver"
    specialist: str = "sandbox:specialist"
    control: str = "sandbox:transmitter-llama"   # same shape as the specialist, no private fact
    general_examples: int = 2000
    fuser: FuserTrainConfig = field(default_factory=FuserTrainConfig)
    task_epochs: int = 4
    seeds: int = 3
    max_eval: int = 0             # 0 = the whole test split
    max_task: int = 0             # 0 = every correctly answered dev/val question
    t2t_max_new_tokens: int = 8
    draft_tokens: int = 3         # draft-only: tokens the transmitter drafts and shares
    teach_steps: int = 500        # fact drills that make the oracle and the parties
    teach_lr: float = 1e-3
    teach_replay: int = 4         # blocks of the world's general corpus replayed per step
    inversion_texts: int = 400    # public texts the inversion attacker trains on
    # multi: one transmitter per entry, each taught a disjoint part of the entities
    parties: tuple[str, ...] = ("sandbox:transmitter-llama", "sandbox:transmitter-qwen2",
                                "sandbox:receiver")
    rows: tuple[str, ...] = ROWS  # which rows run (the receiver alone always does)
    out: str = "runs/refine-transfer"
    progress: bool = True

    def __post_init__(self):
        unknown = set(self.rows) - set(ROWS)
        if unknown:
            raise PlasticError(f"unknown transfer rows {sorted(unknown)}; choose from {ROWS}")


def _settings_key(cfg: TransferConfig) -> str:
    """The settings a stored score depends on (``rows``, ``seeds``, ``out`` and ``progress``
    aside: more seeds or rows extend a run)."""
    kept = {k: v for k, v in dataclasses.asdict(cfg).items()
            if k not in ("rows", "seeds", "out", "progress")}
    return json.dumps(kept, sort_keys=True, default=str)


def entity_of(question: str) -> str:
    """The entity a templated question is about: its first capitalised word after the first."""
    words = re.findall(r"\b[A-Z][\w'-]*", question)
    return words[1] if len(words) > 1 else question


def _items(questions) -> list[ProbeItem]:
    return [ProbeItem(qa_prompt(q.question), tuple(q.choices), q.answer_index) for q in questions]


def _score(fr: FedRefine, items: list[ProbeItem], mode: str, progress: bool, label: str,
           n: int | None = 1) -> list[float]:
    return [float(fr.score(it.prompt, list(it.choices), mode, n).choice == it.answer)
            for it in tqdm(items, desc=label, disable=not progress, leave=False)]


def _score_both(fr: FedRefine, items: list[ProbeItem], progress: bool, label: str
                ) -> tuple[list[float], list[float]]:
    """Co-C2C: (the receiver's, the partner's) correctness per item."""
    ours, theirs = [], []
    for it in tqdm(items, desc=label, disable=not progress, leave=False):
        s = fr.score(it.prompt, list(it.choices), "co-c2c")
        ours.append(float(s.choice == it.answer))
        theirs.append(float(s.partner_choice == it.answer))
    return ours, theirs


def _taught(run: Path, spec: str, name: str, facts: list[tuple[str, str]], cfg: TransferConfig,
            corpus: list[str]) -> Peer:
    """``spec``'s model taught ``facts`` (fact drills), saved once in ``run/taught/name`` and
    reused while the facts and drill settings are the same."""
    from plasticlm.models import load_causal_lm
    from plasticlm.models.pretrain import evaluate_loss, pack_corpus
    from plasticlm.sandbox import teach_facts
    from plasticlm.sandbox.pretrain import save_model_atomic

    folder = run / "taught" / name
    key = hashlib.sha256(json.dumps({"spec": spec, "facts": facts, "steps": cfg.teach_steps,
                                     "lr": cfg.teach_lr, "replay": cfg.teach_replay},
                                    sort_keys=True).encode()).hexdigest()
    stamp = folder / "taught.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("key") == key:
        model, tok = load_causal_lm(folder, dtype="float32")
        return Peer(name, model, tok)
    peer = load_peer(spec)
    # Did the drills keep the language? The corpus loss before and after.
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
    return Peer(name, peer.model, peer.tokenizer)


def _world_texts(receiver_spec: str) -> list[str]:
    from plasticlm.data.corpus import load_text_corpus

    return [d.text for d in load_text_corpus(sandbox_world_of(receiver_spec) / "corpus" /
                                             "train.txt")]


def run_transfer(cfg: TransferConfig) -> dict:
    """Run every row, write ``report.json`` and ``table.md`` into ``cfg.out``; returns the report."""
    from plasticlm.runs import RunDir

    t_start = time.time()
    run = RunDir(Path(cfg.out))
    run.write_json("config.json", cfg)
    receiver, specialist, control = (load_peer(s) for s in (cfg.receiver, cfg.specialist,
                                                            cfg.control))
    train_q, test_q, _ = load_questions(ExperimentConfig(
        receiver=cfg.receiver, train_splits=("dev", "val"), eval_splits=("test",),
        max_eval=cfg.max_eval))
    train_items, test_items = _items(train_q), _items(test_q)
    groups = [entity_of(q.question) for q in test_q]
    overlap = {entity_of(q.question) for q in train_q} & set(groups)
    if overlap:
        raise PlasticError(f"test entities also appear in training: {sorted(overlap)[:3]}")
    transmitters = {"specialist": specialist, "control": control}
    store = run.path / "scores.json"
    key = _settings_key(cfg)
    saved = json.loads(store.read_text()) if store.exists() else {}
    scores: dict[str, list[list[float]]] = saved.get("scores", {}) \
        if saved.get("settings") == key else {}
    extra = saved.get("extra", {}) if saved.get("settings") == key else {}

    def keep() -> None:
        store.write_text(json.dumps({"settings": key, "scores": scores, "extra": extra}) + "\n")

    # -- the probe gate ------------------------------------------------------------------
    def probe_pair(key: str, knows: Peer, blank: Peer) -> None:
        """Linear probes of ``knows``'s and ``blank``'s prompt caches, stored once."""
        if key not in extra:
            a, b = (probe_table(peer, train_items, test_items) for peer in (knows, blank))
            extra[key] = {f"{k[0]}|{k[1]}": [a[k], b[k]] for k in sorted(a)}
            keep()

    def probe_summary(key: str) -> tuple[dict, float, float]:
        rows = {}
        for k, (s_, c_) in extra.get(key, {}).items():
            layer, position = k.split("|")
            d = pooled_bootstrap_ci([s_], baseline_per_seed=[c_], groups_per_seed=[groups])
            rows[f"layer {layer}, {position}"] = {
                "specialist": sum(s_) / len(s_), "control": sum(c_) / len(c_),
                "difference": dataclasses.asdict(d)}
        fused_ = [r["difference"]["mean"] for k, r in rows.items() if not k.endswith(", last")]
        last_ = [r["difference"]["mean"] for k, r in rows.items() if k.endswith(", last")]
        return rows, max(fused_, default=float("nan")), max(last_, default=float("nan"))

    if "probe" in cfg.rows:
        probe_pair("probe", specialist, control)
    probe_rows, fused_best, last_best = probe_summary("probe")
    testable = bool(probe_rows) and 100 * fused_best >= PROBE_GATE_PP
    if cfg.progress and probe_rows:
        print(f"[transfer] probe gate: best specialist - control {100 * fused_best:+.1f} pp at "
              f"fused positions, {100 * last_best:+.1f} pp at the last token", flush=True)

    # -- rows without fusers -------------------------------------------------------------
    def once(label: str, fr: FedRefine, mode: str) -> None:
        if label not in scores:
            scores[label] = [_score(fr, test_items, mode, cfg.progress, label)]
            keep()

    once("alone", FedRefine(receiver), "alone")
    if "t2t" in cfg.rows:
        for name, peer in transmitters.items():
            once(f"transmitter alone, {name}", FedRefine(peer), "alone")
            once(f"t2t, {name}", FedRefine(receiver, [Link(peer, None)], RefineConfig(
                t2t_max_new_tokens=cfg.t2t_max_new_tokens)), "t2t")

    # -- fusers --------------------------------------------------------------------------
    training = extra.setdefault("training", {})
    gates = extra.setdefault("gates_on", {})
    prepared: dict[str, list] = {}   # frozen models: one set of caches serves every seed

    def fit(key: str, receiver_: Peer, peers: list[Peer], examples: list[Example],
            fcfg: FuserTrainConfig, seed: int):
        if key not in prepared:
            prepared[key] = [prepare_examples(receiver_, p, examples, fcfg, cfg.progress)
                             for p in peers]
        return train_fusers(receiver_, peers, examples, dataclasses.replace(fcfg, seed=seed),
                            progress=cfg.progress, prepared=prepared[key])

    def seeded(labels: list[str], run_seed: Callable[[int], tuple[dict, list[float], object]]
               ) -> None:
        """Run ``run_seed(seed) -> ({label: scores}, losses, gates)`` for each missing seed."""
        for label in labels:
            for store_ in (scores, training, gates):
                store_.setdefault(label, [])
        for seed in range(min(len(scores[label]) for label in labels), cfg.seeds):
            t0 = time.time()
            got, losses, gate = run_seed(seed)
            k = max(1, len(losses) // 10)
            info = {"seconds": round(time.time() - t0, 1), "steps": len(losses),
                    "first_loss": round(sum(losses[:k]) / k, 4),
                    "last_loss": round(sum(losses[-k:]) / k, 4)}
            for label in labels:
                scores[label] = scores[label][:seed] + [got[label]]
                training[label] = training[label][:seed] + [info]
                gates[label] = gates[label][:seed] + [gate]
            keep()
            for label in labels:
                acc = sum(got[label]) / len(test_items)
                run.log(row=label, seed=seed, accuracy=acc, **info)
                if cfg.progress:
                    print(f"[transfer] {label} seed {seed}: {100 * acc:.1f}%", flush=True)
        prepared.clear()

    def single(label: str, peer: Peer, examples: list[Example], fcfg: FuserTrainConfig,
               refine: RefineConfig | None = None) -> None:
        def run_seed(seed: int):
            fusers, losses = fit(label, receiver, [peer], examples, fcfg, seed)
            fr = FedRefine(receiver, [Link(peer, fusers[0])], refine)
            return ({label: _score(fr, test_items, "c2c", cfg.progress, label)}, losses,
                    fusers[0].gates_on())
        seeded([label], run_seed)

    corpus = _world_texts(cfg.receiver)
    general = general_examples(corpus, cfg.general_examples)
    task: list[Example] = []
    if {"task", "task_fuse_last"} & set(cfg.rows):
        knows = _score(FedRefine(specialist), train_items, "alone", cfg.progress,
                       "specialist knows")
        task = [Example(it.prompt, qa_continuation(it.choices[it.answer]))
                for it, ok in zip(train_items, knows) if ok][: cfg.max_task or None]
    task_cfg = dataclasses.replace(cfg.fuser, epochs=cfg.task_epochs)
    draft_cfg = dataclasses.replace(cfg.fuser, mode="prefix", share="draft",
                                    draft_tokens=cfg.draft_tokens)
    plans = {
        "general": ("c2c, general fuser", general, cfg.fuser, transmitters),
        "task": ("c2c, task fuser", task, task_cfg, transmitters),
        "task_fuse_last": ("c2c, task fuser, fuse_last", task,
                           dataclasses.replace(task_cfg, fuse_last=True), transmitters),
        "self": ("self-fusion, general fuser", general, cfg.fuser, {"receiver": receiver}),
        "draft": ("c2c draft-only, general fuser", general, draft_cfg, transmitters),
    }
    for row, (title, examples, fcfg, peers) in plans.items():
        if row in cfg.rows:
            for name, peer in peers.items():
                single(f"{title}, {name}", peer, examples, fcfg)

    # -- transmitters taught chosen facts: the oracle, the parties -------------------------
    about = [entity_of(q.question) for q in train_q + test_q]
    facts = [(qa_prompt(q.question), qa_continuation(q.answer_text.strip()))
             for q in train_q + test_q]
    entities = sorted(set(about))

    def part(i: int, k: int) -> list[tuple[str, str]]:
        mine = set(entities[i::k])
        return [f for f, e in zip(facts, about) if e in mine]

    def known_by(k: int) -> list[int]:
        index = {e: i % k for i, e in enumerate(entities)}
        return [index[g] for g in groups]

    oracle = None
    if {"oracle", "private"} & set(cfg.rows):
        oracle = _taught(run.path, cfg.receiver, "oracle", facts, cfg, corpus)
        once("transmitter alone, oracle", FedRefine(oracle), "alone")
    if "oracle" in cfg.rows:
        probe_pair("probe_oracle", oracle, receiver)
        single("c2c, general fuser, oracle", oracle, general, cfg.fuser)
        single("self-fusion, general fuser, receiver", receiver, general, cfg.fuser)
        # The same task fusers as the specialist's, on the dev/val facts the oracle knows;
        # the control is the receiver fused with itself on the same examples.
        knows = _score(FedRefine(oracle), train_items, "alone", cfg.progress, "oracle knows")
        oracle_task = [Example(it.prompt, qa_continuation(it.choices[it.answer]))
                       for it, ok in zip(train_items, knows) if ok][: cfg.max_task or None]
        single("c2c, task fuser, oracle", oracle, oracle_task, task_cfg)
        single("self-fusion, task fuser, receiver", receiver, oracle_task, task_cfg)
    if "private" in cfg.rows:
        if "inversion" not in extra:
            prompts = [it.prompt for it in test_items]
            texts = corpus[: cfg.inversion_texts]
            attack = learned_inversion(oracle.model, oracle.tokenizer, texts, prompts,
                                       [rule_rephrase(x) for x in prompts])
            clear = [float(g in rule_rephrase(x)) for g, x in zip(groups, prompts)]
            extra["inversion"] = {"layers": [dataclasses.asdict(a) for a in attack],
                                  "public_texts": len(texts),
                                  "entity_name_in_clear": sum(clear) / len(clear)}
            keep()
        prefix_cfg = dataclasses.replace(cfg.fuser, mode="prefix")
        single("prefix c2c, general fuser, oracle", oracle, general, prefix_cfg)
        rephrased = [dataclasses.replace(ex, transmitter_text=rule_rephrase(ex.prompt))
                     for ex in general]
        single("prefix c2c private (rephrased), general fuser, oracle", oracle, rephrased,
               dataclasses.replace(prefix_cfg, private=True), RefineConfig(private=True))

    if "multi" in cfg.rows:
        k = len(cfg.parties)
        kinds = {"parties": [_taught(run.path, spec, f"party-{i}", part(i, k), cfg, corpus)
                             for i, spec in enumerate(cfg.parties)],
                 "untaught": [load_peer(spec) for spec in cfg.parties]}
        for kind, peers in kinds.items():
            arch = [p.model.config.model_type for p in peers]
            labels = [f"multi x{k} (parallel), {kind}"] + \
                     [f"c2c via party {i} ({a}) only, {kind}" for i, a in enumerate(arch)]
            for i, p in enumerate(peers):
                once(f"transmitter alone, party {i} ({arch[i]}), {kind}", FedRefine(p), "alone")

            def run_seed(seed: int, kind=kind, peers=peers, labels=labels):
                fusers, losses = fit(kind, receiver, peers, general, cfg.fuser, seed)
                links = [Link(p, f) for p, f in zip(peers, fusers)]
                got = {labels[0]: _score(FedRefine(receiver, links), test_items, "multi",
                                         cfg.progress, labels[0], n=None)}
                for link, label in zip(links, labels[1:]):
                    got[label] = _score(FedRefine(receiver, [link]), test_items, "c2c",
                                        cfg.progress, label)
                return got, losses, [f.gates_on() for f in fusers]
            seeded(labels, run_seed)
        extra["party_of_item"] = known_by(k)

    if "co_c2c" in cfg.rows:
        a = _taught(run.path, cfg.receiver, "half-0", part(0, 2), cfg, corpus)
        b = _taught(run.path, cfg.control, "half-1", part(1, 2), cfg, corpus)
        once("alone, co-party A (receiver taught half 0)", FedRefine(a), "alone")
        once("alone, co-party B (control taught half 1)", FedRefine(b), "alone")
        labels = ["co-c2c, co-party A (receiver taught half 0)",
                  "co-c2c, co-party B (control taught half 1)"]

        def run_co(seed: int):
            (f_ba,), loss_a = fit("co-a", a, [b], general, cfg.fuser, seed)
            (f_ab,), loss_b = fit("co-b", b, [a], general, cfg.fuser, seed)
            ours, theirs = _score_both(FedRefine(a, [Link(b, f_ba)], reverse_fuser=f_ab),
                                       test_items, cfg.progress, "co-c2c")
            return {labels[0]: ours, labels[1]: theirs}, loss_a + loss_b, \
                [f_ba.gates_on(), f_ab.gates_on()]
        seeded(labels, run_co)
        extra["half_of_item"] = known_by(2)

    # -- intervals -----------------------------------------------------------------------
    results = {}
    for label, per_seed in scores.items():
        if not per_seed:
            continue
        g = [groups] * len(per_seed)
        entry = {"accuracy": dataclasses.asdict(pooled_bootstrap_ci(per_seed, groups_per_seed=g)),
                 "seeds": len(per_seed)}
        alone = scores["alone"] * len(per_seed)
        entry["minus_alone"] = dataclasses.asdict(
            pooled_bootstrap_ci(per_seed, baseline_per_seed=alone, groups_per_seed=g))
        control = control_of(label)
        if control in scores and len(scores[control]) >= 1:
            ctrl = scores[control]
            ctrl = (ctrl * len(per_seed))[: len(per_seed)] if len(ctrl) < len(per_seed) else \
                ctrl[: len(per_seed)]
            entry["control"] = control
            entry["minus_control"] = dataclasses.asdict(
                pooled_bootstrap_ci(per_seed, baseline_per_seed=ctrl, groups_per_seed=g))
            owner = _owner_of(label, extra)
            if owner is not None:
                # Paired on the items whose entity this party / half was taught.
                keep_ = [[x for x, o in zip(row, owner[0]) if o == owner[1]]
                         for row in per_seed]
                base = [[x for x, o in zip(row, owner[0]) if o == owner[1]] for row in ctrl]
                sub = [[gr for gr, o in zip(groups, owner[0]) if o == owner[1]]] * len(per_seed)
                entry["minus_control_on_taught"] = dataclasses.asdict(pooled_bootstrap_ci(
                    keep_, baseline_per_seed=base, groups_per_seed=sub))
        results[label] = entry
    oracle_probe = None
    if "probe_oracle" in extra:
        rows_o, fused_o, last_o = probe_summary("probe_oracle")
        oracle_probe = {"rows": rows_o, "best_fused_pp": 100 * fused_o,
                        "best_last_pp": 100 * last_o}
    report = {"n_eval": len(test_items), "test_entities": len(set(groups)),
              "n_task_examples": len(task), "n_general_examples": len(general),
              "probe_gate": {"rows": probe_rows, "best_fused_pp": 100 * fused_best,
                             "best_last_pp": 100 * last_best, "threshold_pp": PROBE_GATE_PP,
                             "testable": testable},
              "oracle_probe": oracle_probe,
              "results": results, "fuser_training": training, "gates_on": gates,
              "inversion": extra.get("inversion"),
              "taught": {f.parent.name: {k: v for k, v in json.loads(f.read_text()).items()
                                         if k != "key"}
                         for f in sorted((run.path / "taught").glob("*/taught.json"))},
              "seconds": round(time.time() - t_start, 1)}
    run.write_json("report.json", report)
    (run.path / "table.md").write_text(transfer_table(report) + "\n")
    return report


def control_of(label: str) -> str | None:
    """The row a trivial system would need to beat for ``label`` (None: only alone)."""
    for suffix, control in ((", specialist", ", control"), (", parties", ", untaught")):
        if label.endswith(suffix):
            return label[: -len(suffix)] + control
    if label.startswith("c2c, ") and label.endswith(", oracle"):
        return "self-fusion, " + label[len("c2c, "): -len(", oracle")] + ", receiver"
    if label.startswith("prefix c2c private (rephrased)"):
        return label.replace(" private (rephrased)", "")
    if label.startswith("co-c2c, "):
        return "alone, " + label[len("co-c2c, "):]
    return None


def _owner_of(label: str, extra: dict) -> tuple[list[int], int] | None:
    """(which party / half was taught each test item's entity, the one this row's
    transmitter is), for the rows whose transmitter knows a part of the entities."""
    m = re.match(r"(?:c2c via|transmitter alone,) party (\d+) ", label)
    if m and "party_of_item" in extra:
        return extra["party_of_item"], int(m.group(1))
    if label.startswith("co-c2c, co-party ") and "half_of_item" in extra:
        # A reads B's cache: the items B was taught (half 1), and the other way round.
        return extra["half_of_item"], 1 if " A " in label else 0
    return None


def transfer_table(report: dict) -> str:
    """The report as Markdown: the probe gate, then every row with its control."""
    gate = report["probe_gate"]
    if gate["rows"]:
        verdict = ("testable." if gate["testable"] else
                   "**not testable with this transmitter** at C2C's positions.")
        head = (f"Probe gate (linear probe from the prompt cache, held-out entities, n = "
                f"{report['n_eval']}): best specialist - control at the positions C2C fuses "
                f"{gate['best_fused_pp']:+.1f} pp, at the last prompt token "
                f"{gate['best_last_pp']:+.1f} pp (threshold {gate['threshold_pp']:.0f} pp): "
                + verdict)
    else:
        head = "Probe gate: not run (rows without 'probe')."
    oracle = report.get("oracle_probe")
    if oracle:
        head += (f"\n\nOracle probe (the same probe on the oracle's cache, minus the receiver's): "
                 f"best {oracle['best_fused_pp']:+.1f} pp at the positions C2C fuses, "
                 f"{oracle['best_last_pp']:+.1f} pp at the last prompt token.")
    lines = [head, "",
             "| row (4-way choice, held-out entities) | accuracy [95% CI] | minus alone | "
             "minus its control | its control | minus control, taught entities only |",
             "|---|---|---|---|---|---|"]
    for label, r in report["results"].items():
        control = format_ci(CI(**r["minus_control"])) if "minus_control" in r else "-"
        taught = (format_ci(CI(**r["minus_control_on_taught"]))
                  if "minus_control_on_taught" in r else "-")
        lines.append(f"| {label} | {format_ci(CI(**r['accuracy']))} | "
                     f"{format_ci(CI(**r['minus_alone']))} | {control} | "
                     f"{r.get('control', '-')} | {taught} |")
    lines.append("")
    lines.append(f"{report['n_eval']} test questions about {report['test_entities']} entities "
                 "that no fuser saw; chance 25%. The control transmitter has the specialist's "
                 "shape and tokenizer and no private fact; the oracle's control is self-fusion "
                 "(the receiver without the facts); the parties' control is the same models "
                 "untaught; a co-party's control is that party alone. 'Taught entities only': "
                 "the items whose entity that transmitter (co-c2c: the partner) was taught.")
    inv = report.get("inversion")
    if inv:
        lines += ["", "Learned inversion of the oracle's cache (decoder per layer trained on "
                  f"{inv['public_texts']} public texts; token recall of the test prompts):", "",
                  "| layer | recall, prompt in clear | right token at right position | "
                  "recall from the rephrased prompt's cache |", "|---|---|---|---|"]
        for a in inv["layers"]:
            lines.append(f"| {a['layer']} | {100 * a['raw_recall']:.1f}% | "
                         f"{100 * a['raw_position_accuracy']:.1f}% | "
                         f"{100 * a['rephrased_recall']:.1f}% |")
        lines.append("")
        lines.append(f"In private mode the transmitter reads the rephrasing in clear; it keeps "
                     f"the entity name in {100 * inv['entity_name_in_clear']:.0f}% of prompts.")
    return "\n".join(lines)
