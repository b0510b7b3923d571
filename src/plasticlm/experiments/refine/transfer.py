"""``plasticlm refine experiment transfer``: does a fuser carry what the transmitter knows to
entities no fuser was trained on, beyond what a transmitter that knows nothing gives?

On the sandbox: the receiver, the specialist (knows the private facts of the world's
specialist entities) and a control transmitter of the specialist's shape and tokenizer that
never saw a private fact (``sandbox:transmitter-llama``). Every question is scored as a 4-way
choice on the specialist's ``test`` split (entities disjoint from ``dev``/``val``, which the
task fusers train on). Rows, each beside its control:

- the probe gate (:mod:`plasticlm.experiments.refine.probe`): a linear probe from each transmitter's
  prompt cache, per layer and position, specialist minus control;
- alone (the receiver), and each transmitter alone;
- T2T: the transmitter writes a background line, the receiver reads it;
- C2C, general fuser: trained on the world's general material only (corpus continuations and
  core-entity Q/A lines, :func:`plasticlm.refine.fusers.train.general_examples`), as C2C pre-trains;
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
import json
import logging
import time

from plasticlm.experiments.refine.ladder import ROWS, Ladder, TransferConfig, entity_of
from plasticlm.experiments.refine.taught import (
    Facts,
    co_c2c_rows,
    multi_rows,
    oracle_peer,
    oracle_rows,
    private_rows,
)
from plasticlm.experiments.refine.training_text import training_examples
from plasticlm.refine.examples import Example
from plasticlm.refine.fedrefine import FedRefine
from plasticlm.refine.link import Link
from plasticlm.refine.modes import RefineConfig
from plasticlm.refine.report import probe_summary, transfer_results, transfer_table

log = logging.getLogger("plasticlm.refine")

PROBE_GATE_PP = 15.0      # the probe must beat the control's by this much at fused positions

__all__ = ["PROBE_GATE_PP", "ROWS", "TransferConfig", "entity_of", "run_transfer"]


def run_transfer(cfg: TransferConfig) -> dict:
    """Run every row, write ``report.json`` and ``table.md`` into ``cfg.out``; returns the report."""
    lad = Ladder(cfg)
    rows = set(cfg.rows)
    receiver, specialist, control = lad.receiver, lad.specialist, lad.control
    transmitters = {"specialist": specialist, "control": control}

    if "probe" in rows:
        lad.probe_pair("probe", specialist, control)
    probe_rows, fused_best, last_best = probe_summary(lad.extra, "probe", lad.groups)
    if cfg.progress and probe_rows:
        log.info("probe gate: best specialist - control %+.1f pp at fused positions, %+.1f pp "
                 "at the last token", 100 * fused_best, 100 * last_best)

    lad.once("alone", FedRefine(receiver), "alone")
    if "t2t" in rows:
        for name, peer in transmitters.items():
            lad.once(f"transmitter alone, {name}", FedRefine(peer), "alone")
            lad.once(f"t2t, {name}", FedRefine(receiver, [Link(peer, None)], RefineConfig(
                t2t_max_new_tokens=cfg.t2t_max_new_tokens)), "t2t")

    general = training_examples(cfg.train_text, cfg.general_examples, lad.corpus, cfg.receiver,
                                set(lad.groups))
    task: list[Example] = []
    if {"task", "task_fuse_last"} & rows:
        task = lad.knows(specialist, "specialist knows")
    task_cfg = dataclasses.replace(cfg.fuser, epochs=cfg.task_epochs)
    draft_cfg = None    # share="draft" needs draft_tokens >= 1: built only when the row runs
    if "draft" in rows:
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
        if row in rows:
            for name, peer in peers.items():
                lad.single(f"{title}, {name}", peer, examples, fcfg)

    facts = Facts(lad)
    if {"oracle", "private"} & rows:
        oracle = oracle_peer(lad, facts)
        if "oracle" in rows:
            oracle_rows(lad, oracle, general, task_cfg)
        if "private" in rows:
            private_rows(lad, oracle, general)
    if "multi" in rows:
        multi_rows(lad, facts, general)
    if "co_c2c" in rows:
        co_c2c_rows(lad, facts, general)

    oracle_probe = None
    if "probe_oracle" in lad.extra:
        rows_o, fused_o, last_o = probe_summary(lad.extra, "probe_oracle", lad.groups)
        oracle_probe = {"rows": rows_o, "best_fused_pp": 100 * fused_o,
                        "best_last_pp": 100 * last_o}
    report = {"n_eval": len(lad.test_items), "test_entities": len(set(lad.groups)),
              "n_task_examples": len(task), "n_general_examples": len(general),
              "probe_gate": {"rows": probe_rows, "best_fused_pp": 100 * fused_best,
                             "best_last_pp": 100 * last_best, "threshold_pp": PROBE_GATE_PP,
                             "testable": bool(probe_rows) and 100 * fused_best >= PROBE_GATE_PP},
              "oracle_probe": oracle_probe,
              "results": transfer_results(lad.scores, lad.extra, lad.groups),
              "fuser_training": lad.training, "gates_on": lad.gates,
              "inversion": lad.extra.get("inversion"),
              "taught": {f.parent.name: {k: v for k, v in json.loads(f.read_text()).items()
                                         if k != "key"}
                         for f in sorted((lad.run.path / "taught").glob("*/taught.json"))},
              "seconds": round(time.time() - lad.started, 1)}
    lad.run.write_json("report.json", report)
    (lad.run.path / "table.md").write_text(transfer_table(report) + "\n")
    return report
