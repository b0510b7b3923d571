"""The ladder's results (``plasticlm refine experiment ladder``): per row its accuracy, the
difference to alone and to its control (entity-clustered intervals pooled over seeds, paired
on the same items, and the seeds' t-interval), and the fraction of the ceiling it reaches,
(row - alone) / (hand-over - alone); written as ``report.json`` and ``table.md``."""

from __future__ import annotations

import dataclasses
import json
import time

from plasticlm.eval import CI, format_ci, format_summary, paired_summary, pooled_bootstrap_ci
from plasticlm.experiments.refine.ladder import Ladder
from plasticlm.experiments.refine.rungs import LABELS, LadderConfig, run_rungs
from plasticlm.refine.fusers.align import align_tokens
from plasticlm.refine.report import probe_summary

PROBE_GATE_PP = 15.0      # as the transfer experiment's gate


def _mean(scores: list[list[float]]) -> float:
    return sum(map(sum, scores)) / sum(map(len, scores))


def ladder_results(lad: Ladder) -> dict:
    """Per row (rung order, each knowing row followed by its control)."""
    scores, groups = lad.scores, lad.groups
    alone = _mean(scores["alone"])
    ceiling = scores.get(LABELS["handover"][0])
    span = _mean(ceiling) - alone if ceiling else None
    order = ["alone", "transmitter alone, oracle", "transmitter alone, specialist"]
    controls = {}
    for knows, blank in LABELS.values():
        order += [knows, blank]
        controls[knows] = blank
    results = {}
    for label in order:
        per_seed = scores.get(label)
        if not per_seed or label in results:
            continue
        g = [groups] * len(per_seed)
        entry = {"accuracy": dataclasses.asdict(pooled_bootstrap_ci(per_seed, groups_per_seed=g)),
                 "seeds": len(per_seed)}
        entry.update(paired_summary("minus_alone", per_seed, scores["alone"] * len(per_seed), g))
        control = controls.get(label)
        if control and control != "alone" and scores.get(control):
            ctrl = scores[control]
            ctrl = (ctrl * len(per_seed))[: len(per_seed)]
            entry["control"] = control
            entry.update(paired_summary("minus_control", per_seed, ctrl, g))
        if span and label != "alone" and (label in controls or label in controls.values()):
            entry["fraction_of_ceiling"] = (_mean(per_seed) - alone) / span
        results[label] = entry
    return results


def ladder_table(report: dict) -> str:
    """The report as Markdown."""
    lines = ["| row (4-way choice, held-out entities) | accuracy [95% CI] | minus alone | "
             "minus its control | its control | fraction of the ceiling |",
             "|---|---|---|---|---|---|"]
    for label, r in report["results"].items():
        frac = r.get("fraction_of_ceiling")
        lines.append(f"| {label} | {format_ci(CI(**r['accuracy']))} | "
                     f"{format_summary(r, 'minus_alone')} | {format_summary(r, 'minus_control')}"
                     f" | {r.get('control', '-')} | "
                     f"{'-' if frac is None else f'{100 * frac:.0f}%'} |")
    lines += ["", f"{report['n_eval']} test questions about {report['test_entities']} entities "
              "no fuser trained on; chance 25%. Fraction of the ceiling: (row - alone) / "
              "(hand-over - alone), on means. The oracle is the receiver taught every fact; "
              "its control is the receiver itself. Recipe: "
              f"objective {report['recipe']['objective']}, lr {report['recipe']['lr']}, "
              f"{report['recipe']['epochs']} epochs, hidden {report['recipe']['hidden']}."]
    if report.get("zero_equals_alone") is not None:
        lines.append(f"Rung a equals alone item for item: {report['zero_equals_alone']}.")
    for key, who in (("oracle_probe_gate", "oracle - receiver (rungs c-f)"),
                     ("probe_gate", "specialist - control (rung g)")):
        gate = report.get(key)
        if gate and gate["rows"]:
            lines.append(f"Probe gate, {who}: best at the positions C2C fuses "
                         f"{gate['best_fused_pp']:+.1f} pp, at the last prompt token "
                         f"{gate['best_last_pp']:+.1f} pp (threshold {PROBE_GATE_PP:.0f} pp): "
                         + ("passed." if gate["testable"] else "**not passed**."))
    seg = report.get("segmentation")
    if seg:
        lines.append(f"Tokenizers: {100 * seg['prompts_cut_differently']:.0f}% of the test "
                     f"prompts are cut differently by the specialist's and the receiver's "
                     f"(mean {seg['specialist_tokens']:.1f} vs {seg['receiver_tokens']:.1f} "
                     "tokens); rung g aligns them by character offsets.")
    return "\n".join(lines)


def segmentation(lad: Ladder) -> dict:
    """How differently the specialist's and the receiver's tokenizers cut the test prompts
    (what rung g's token alignment has to bridge)."""
    cuts = [align_tokens(lad.receiver.tokenizer, lad.specialist.tokenizer, it.prompt)
            for it in lad.test_items]
    differ = [len(a.receiver_ids) != len(a.transmitter_ids) or a.index != list(range(len(a.index)))
              for a in cuts]
    n = len(cuts)
    return {"prompts_cut_differently": sum(differ) / n,
            "receiver_tokens": sum(len(a.receiver_ids) for a in cuts) / n,
            "specialist_tokens": sum(len(a.transmitter_ids) for a in cuts) / n}


def run_ladder(cfg: LadderConfig) -> dict:
    """Run the rungs, write ``report.json`` and ``table.md`` into ``cfg.out``; return the
    report."""
    lad = Ladder(cfg)
    run_rungs(lad)
    gates = {}
    for key in ("probe", "probe_oracle"):
        if key in lad.extra:
            rows, fused, last = probe_summary(lad.extra, key, lad.groups)
            gates[key] = {"rows": rows, "best_fused_pp": 100 * fused, "best_last_pp": 100 * last,
                          "testable": 100 * fused >= PROBE_GATE_PP}
    report = {"n_eval": len(lad.test_items), "test_entities": len(set(lad.groups)),
              "recipe": dataclasses.asdict(cfg.fuser),
              "results": ladder_results(lad), "zero_equals_alone":
              lad.extra.get("zero_equals_alone"), "probe_gate": gates.get("probe"),
              "oracle_probe_gate": gates.get("probe_oracle"),
              "segmentation": segmentation(lad) if "specialist" in cfg.rungs else None,
              "fuser_training": lad.training, "gates_on": lad.gates,
              "taught": {f.parent.name: {k: v for k, v in json.loads(f.read_text()).items()
                                         if k != "key"}
                         for f in sorted((lad.run.path / "taught").glob("*/taught.json"))},
              "seconds": round(time.time() - lad.started, 1)}
    lad.run.write_json("report.json", report)
    (lad.run.path / "table.md").write_text(ladder_table(report) + "\n")
    return report
