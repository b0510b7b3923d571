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
  hurt).

``rows`` picks which of these run. Per-item scores are kept in ``scores.json`` in the run
folder, so a rerun with the same settings (``rows`` aside) only runs what is missing.
Fusers train with ``seeds`` seeds; intervals are entity-clustered bootstrap intervals pooled
over seeds, differences paired on the same items.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
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
from plasticlm.refine.modes import FedRefine, Link, RefineConfig
from plasticlm.refine.probe import ProbeItem, probe_table
from plasticlm.refine.train import (
    Example,
    FuserTrainConfig,
    general_examples,
    prepare_examples,
    train_fuser,
)

PROBE_GATE_PP = 15.0      # the probe must beat the control's by this much at fused positions
ROWS = ("probe", "t2t", "general", "task", "task_fuse_last", "self")


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


def _score(fr: FedRefine, items: list[ProbeItem], mode: str, progress: bool, label: str
           ) -> list[float]:
    return [float(fr.score(it.prompt, list(it.choices), mode, 1).choice == it.answer)
            for it in tqdm(items, desc=label, disable=not progress, leave=False)]


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
    if "probe" in cfg.rows and "probe" not in extra:
        probes = {name: probe_table(peer, train_items, test_items) for name, peer in
                  transmitters.items()}
        extra["probe"] = {f"{k[0]}|{k[1]}": [probes["specialist"][k], probes["control"][k]]
                          for k in sorted(probes["specialist"])}
        keep()
    probe_rows = {}
    for k, (s_, c_) in extra.get("probe", {}).items():
        layer, position = k.split("|")
        d = pooled_bootstrap_ci([s_], baseline_per_seed=[c_], groups_per_seed=[groups])
        probe_rows[f"layer {layer}, {position}"] = {
            "specialist": sum(s_) / len(s_), "control": sum(c_) / len(c_),
            "difference": dataclasses.asdict(d)}
    fused = [r["difference"]["mean"] for k, r in probe_rows.items() if not k.endswith(", last")]
    last = [r["difference"]["mean"] for k, r in probe_rows.items() if k.endswith(", last")]
    fused_best, last_best = max(fused, default=float("nan")), max(last, default=float("nan"))
    testable = bool(fused) and 100 * fused_best >= PROBE_GATE_PP
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
    general = general_examples(_world_texts(cfg.receiver), cfg.general_examples)
    task: list[Example] = []
    if {"task", "task_fuse_last"} & set(cfg.rows):
        knows = _score(FedRefine(specialist), train_items, "alone", cfg.progress,
                       "specialist knows")
        task = [Example(it.prompt, qa_continuation(it.choices[it.answer]))
                for it, ok in zip(train_items, knows) if ok][: cfg.max_task or None]
    task_cfg = dataclasses.replace(cfg.fuser, epochs=cfg.task_epochs)
    plans = {
        "general": ("c2c, general fuser", general, cfg.fuser, transmitters),
        "task": ("c2c, task fuser", task, task_cfg, transmitters),
        "task_fuse_last": ("c2c, task fuser, fuse_last", task,
                           dataclasses.replace(task_cfg, fuse_last=True), transmitters),
        "self": ("self-fusion, general fuser", general, cfg.fuser, {"receiver": receiver}),
    }
    training = extra.setdefault("training", {})
    gates = extra.setdefault("gates_on", {})
    for row, (title, examples, fcfg, peers) in plans.items():
        if row not in cfg.rows:
            continue
        for name, peer in peers.items():
            label = f"{title}, {name}"
            scores.setdefault(label, [])
            training.setdefault(label, [])
            gates.setdefault(label, [])
            caches = None   # both models are frozen: the caches serve every seed
            for seed in range(len(scores[label]), cfg.seeds):
                t0 = time.time()
                if caches is None:
                    caches = prepare_examples(receiver, peer, examples, fcfg, cfg.progress)
                fuser, losses = train_fuser(receiver, peer, examples,
                                            dataclasses.replace(fcfg, seed=seed),
                                            progress=cfg.progress, prepared=caches)
                fr = FedRefine(receiver, [Link(peer, fuser)])
                scores[label].append(_score(fr, test_items, "c2c", cfg.progress, label))
                k = max(1, len(losses) // 10)
                training[label].append({"seconds": round(time.time() - t0, 1),
                                        "steps": len(losses),
                                        "first_loss": round(sum(losses[:k]) / k, 4),
                                        "last_loss": round(sum(losses[-k:]) / k, 4)})
                gates[label].append(fuser.gates_on())
                keep()
                run.log(row=label, seed=seed, accuracy=sum(scores[label][-1]) / len(test_items),
                        **training[label][-1])
                if cfg.progress:
                    print(f"[transfer] {label} seed {seed}: "
                          f"{100 * sum(scores[label][-1]) / len(test_items):.1f}%", flush=True)

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
        if label.endswith(", specialist") and label.replace(", specialist", ", control") in scores:
            ctrl = scores[label.replace(", specialist", ", control")]
            entry["minus_control"] = dataclasses.asdict(
                pooled_bootstrap_ci(per_seed, baseline_per_seed=ctrl, groups_per_seed=g))
        results[label] = entry
    report = {"n_eval": len(test_items), "test_entities": len(set(groups)),
              "n_task_examples": len(task), "n_general_examples": len(general),
              "probe_gate": {"rows": probe_rows, "best_fused_pp": 100 * fused_best,
                             "best_last_pp": 100 * last_best, "threshold_pp": PROBE_GATE_PP,
                             "testable": testable},
              "results": results, "fuser_training": training, "gates_on": gates,
              "seconds": round(time.time() - t_start, 1)}
    run.write_json("report.json", report)
    (run.path / "table.md").write_text(transfer_table(report) + "\n")
    return report


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
    lines = [head, "",
             "| row (4-way choice, held-out entities) | accuracy [95% CI] | minus alone | "
             "minus its control |", "|---|---|---|---|"]
    for label, r in report["results"].items():
        control = format_ci(CI(**r["minus_control"])) if "minus_control" in r else "-"
        lines.append(f"| {label} | {format_ci(CI(**r['accuracy']))} | "
                     f"{format_ci(CI(**r['minus_alone']))} | {control} |")
    lines.append("")
    lines.append(f"{report['n_eval']} test questions about {report['test_entities']} entities "
                 "that no fuser saw; chance 25%. Controls: the same row with the control "
                 "transmitter (specialist's shape and tokenizer, no private fact).")
    return "\n".join(lines)
