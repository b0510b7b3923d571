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
- C2C, task fuser with ``fuse_last`` (the ablation that also fuses the last prompt token).

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

import torch
from tqdm.auto import tqdm

from plasticlm.errors import PlasticError
from plasticlm.eval import CI, format_ci, pooled_bootstrap_ci, qa_continuation, qa_prompt
from plasticlm.refine.experiment import load_peer
from plasticlm.refine.modes import FedRefine, Link, RefineConfig
from plasticlm.refine.probe import ProbeItem, probe_table
from plasticlm.refine.train import Example, FuserTrainConfig, general_examples, train_fuser

PROBE_GATE_PP = 15.0      # the probe must beat the control's by this much at fused positions


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
    out: str = "runs/refine-transfer"
    progress: bool = True


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
    from plasticlm.sandbox import sandbox_world

    preset = receiver_spec.split(":", 1)[0]
    if preset not in ("sandbox", "quick"):
        raise PlasticError("the transfer experiment runs on the sandbox: give the receiver as "
                           "sandbox:NAME or quick:NAME")
    return [d.text for d in load_text_corpus(sandbox_world(preset) / "corpus" / "train.txt")]


def run_transfer(cfg: TransferConfig) -> dict:
    """Run every row, write ``report.json`` and ``table.md`` into ``cfg.out``; returns the report."""
    from plasticlm.data.mmlu import load_mmlu
    from plasticlm.runs import RunDir
    from plasticlm.sandbox import sandbox_world

    t_start = time.time()
    run = RunDir(Path(cfg.out))
    run.write_json("config.json", cfg)
    receiver, specialist, control = (load_peer(s) for s in (cfg.receiver, cfg.specialist,
                                                            cfg.control))
    folder = sandbox_world(cfg.receiver.split(":", 1)[0]) / "specialist_mmlu"
    train_q = [q for s in ("dev", "val") for q in load_mmlu(folder, s)]
    test_q = load_mmlu(folder, "test")[: cfg.max_eval or None]
    train_items, test_items = _items(train_q), _items(test_q)
    groups = [entity_of(q.question) for q in test_q]
    overlap = {entity_of(q.question) for q in train_q} & set(groups)
    if overlap:
        raise PlasticError(f"test entities also appear in training: {sorted(overlap)[:3]}")
    transmitters = {"specialist": specialist, "control": control}

    # -- the probe gate ------------------------------------------------------------------
    probes = {name: probe_table(peer, train_items, test_items) for name, peer in
              transmitters.items()}
    probe_rows = {}
    for key in sorted(probes["specialist"]):
        s, c = probes["specialist"][key], probes["control"][key]
        d = pooled_bootstrap_ci([s], baseline_per_seed=[c], groups_per_seed=[groups])
        probe_rows[f"layer {key[0]}, {key[1]}"] = {
            "specialist": sum(s) / len(s), "control": sum(c) / len(c),
            "difference": dataclasses.asdict(d)}
    fused_best = max(r["difference"]["mean"] for k, r in probe_rows.items()
                     if not k.endswith(", last"))
    last_best = max(r["difference"]["mean"] for k, r in probe_rows.items() if k.endswith(", last"))
    testable = 100 * fused_best >= PROBE_GATE_PP
    if cfg.progress:
        print(f"[transfer] probe gate: best specialist - control {100 * fused_best:+.1f} pp at "
              f"fused positions, {100 * last_best:+.1f} pp at the last token", flush=True)

    # -- rows without fusers -------------------------------------------------------------
    scores: dict[str, list[list[float]]] = {}
    scores["alone"] = [_score(FedRefine(receiver), test_items, "alone", cfg.progress, "alone")]
    for name, peer in transmitters.items():
        scores[f"transmitter alone, {name}"] = [_score(FedRefine(peer), test_items, "alone",
                                                       cfg.progress, name)]
        t2t = FedRefine(receiver, [Link(peer, None)],
                        RefineConfig(t2t_max_new_tokens=cfg.t2t_max_new_tokens))
        scores[f"t2t, {name}"] = [_score(t2t, test_items, "t2t", cfg.progress, f"t2t {name}")]

    # -- fusers --------------------------------------------------------------------------
    general = general_examples(_world_texts(cfg.receiver), cfg.general_examples)
    knows = _score(FedRefine(specialist), train_items, "alone", cfg.progress, "specialist knows")
    task = [Example(it.prompt, qa_continuation(it.choices[it.answer]))
            for it, ok in zip(train_items, knows) if ok][: cfg.max_task or None]
    fuser_rows = {
        "c2c, general fuser": (general, cfg.fuser),
        "c2c, task fuser": (task, dataclasses.replace(cfg.fuser, epochs=cfg.task_epochs)),
        "c2c, task fuser, fuse_last": (task, dataclasses.replace(cfg.fuser, epochs=cfg.task_epochs,
                                                                  fuse_last=True)),
    }
    training: dict[str, list[dict]] = {}
    gates: dict[str, list[dict]] = {}
    for row, (examples, fcfg) in fuser_rows.items():
        for name, peer in transmitters.items():
            label = f"{row}, {name}"
            scores[label], training[label], gates[label] = [], [], []
            for seed in range(cfg.seeds):
                t0 = time.time()
                fuser, losses = train_fuser(receiver, peer, examples,
                                            dataclasses.replace(fcfg, seed=seed),
                                            progress=cfg.progress)
                fr = FedRefine(receiver, [Link(peer, fuser)])
                scores[label].append(_score(fr, test_items, "c2c", cfg.progress, label))
                k = max(1, len(losses) // 10)
                training[label].append({"seconds": round(time.time() - t0, 1),
                                        "steps": len(losses),
                                        "first_loss": round(sum(losses[:k]) / k, 4),
                                        "last_loss": round(sum(losses[-k:]) / k, 4)})
                gates[label].append(fuser.gates_on())
                run.log(row=label, seed=seed, accuracy=sum(scores[label][-1]) / len(test_items),
                        **training[label][-1])
                if cfg.progress:
                    print(f"[transfer] {label} seed {seed}: "
                          f"{100 * sum(scores[label][-1]) / len(test_items):.1f}%", flush=True)

    # -- intervals -----------------------------------------------------------------------
    results = {}
    for label, per_seed in scores.items():
        g = [groups] * len(per_seed)
        entry = {"accuracy": dataclasses.asdict(pooled_bootstrap_ci(per_seed, groups_per_seed=g)),
                 "seeds": len(per_seed)}
        alone = scores["alone"] * len(per_seed)
        entry["minus_alone"] = dataclasses.asdict(
            pooled_bootstrap_ci(per_seed, baseline_per_seed=alone, groups_per_seed=g))
        if label.endswith(", specialist"):
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
    lines = [f"Probe gate (linear probe from the prompt cache, held-out entities, n = "
             f"{report['n_eval']}): best specialist - control at the positions C2C fuses "
             f"{gate['best_fused_pp']:+.1f} pp, at the last prompt token "
             f"{gate['best_last_pp']:+.1f} pp (threshold {gate['threshold_pp']:.0f} pp): "
             + ("testable." if gate["testable"] else
                "**not testable with this transmitter** at C2C's positions."),
             "",
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
