"""SCoL's tables and the paper's numbers: one seed's table, the seed-pooled table with its
controls (the methods' labels and paper numbers come from their registry, ``SCOL_METHODS``)."""

from __future__ import annotations

from dataclasses import asdict

from plasticlm.eval import format_summary, paired_summary, pooled_bootstrap_ci
from plasticlm.scol.baselines import SCOL_METHODS

# The SCoL paper (Self-Consolidating Language Models; Qwen-scale models, SQuAD, 100 passages,
# LLM-judge accuracy): each method's numbers, where it reports them, and the Fisher recall.
PAPER = {**{name: m.paper for name, m in SCOL_METHODS.items() if m.paper},
         "fisher_recall": {"selected": 0.451, "random": 0.357}}


def label(name: str) -> str:
    """How the tables name a method (a name no longer registered stands for itself)."""
    return SCOL_METHODS[name].label if name in SCOL_METHODS else name


def from_policy(name: str) -> bool:
    """Whether a method's layers are chosen by a meta-trained policy (its histogram shows)."""
    return name in SCOL_METHODS and SCOL_METHODS[name].policy is not None


def _cells(report: dict, name: str) -> tuple[list[float], list[float]]:
    """(diagonal, last row but its last entry) of a method's EM matrix: the per-context
    items of immediate and retention."""
    m = report["methods"][name]["matrix_em"]
    return [row[i] for i, row in enumerate(m)], m[-1][:-1]


def _mc_cells(report: dict, name: str) -> tuple[list[float], list[float]] | None:
    m = report["methods"][name]
    if not m.get("mc_diag") or not m.get("mc_last"):
        return None
    return m["mc_diag"], m["mc_last"][:-1]


def _closed_set_summary(reports: list[dict], name: str) -> dict:
    """Closed-set MC immediate and retention with intervals, net of the untouched model and
    paired against the untrained policy and the fixed last layer (empty for older runs)."""
    cells = [_mc_cells(r, name) for r in reports]
    base = [r.get("base_mc_last") for r in reports]
    if any(c is None for c in cells) or not all(base):
        return {}
    imm, ret = [c[0] for c in cells], [c[1] for c in cells]
    out = {"mc_immediate": asdict(pooled_bootstrap_ci(imm)),
           "mc_retention": asdict(pooled_bootstrap_ci(ret)),
           "mc_chance": sum(r["methods"][name]["mc_chance"] for r in reports) / len(reports)}
    out.update(paired_summary("mc_retention_minus_base", ret, [b[:-1] for b in base]))
    for control in ("untrained_policy", "fixed_last"):
        other = [_mc_cells(r, control) if control in r["methods"] else None for r in reports]
        if control != name and all(o is not None for o in other):
            out.update(paired_summary(f"mc_retention_minus_{control}", ret,
                                      [o[1] for o in other]))
    return out


def summarise_seeds(reports: list[dict]) -> dict:
    """Per method: immediate and retention EM with 95% intervals over seeds x contexts;
    retention net of the untouched model (paired on the same contexts); and the paired
    differences to the controls a learned policy must beat."""
    methods = [m for m in reports[0]["methods"] if all(m in r["methods"] for r in reports)]
    base = [r["base_matrix_em"][-1][:-1] for r in reports]
    out = {}
    for name in methods:
        imm = [_cells(r, name)[0] for r in reports]
        ret = [_cells(r, name)[1] for r in reports]
        entry = {"immediate": asdict(pooled_bootstrap_ci(imm)),
                 "retention": asdict(pooled_bootstrap_ci(ret))}
        entry.update(paired_summary("retention_minus_base", ret, base))
        for control in ("untrained_policy", "fixed_last", "sequential_ft"):
            if control in methods and control != name:
                entry.update(paired_summary(f"immediate_minus_{control}", imm,
                                            [_cells(r, control)[0] for r in reports]))
                entry.update(paired_summary(f"retention_minus_{control}", ret,
                                            [_cells(r, control)[1] for r in reports]))
        entry.update(paired_summary("immediate_minus_base", imm,
                                    [r["base_matrix_em"][-1] for r in reports]))
        swap_imm = [r["methods"][name].get("swap_diag") or [] for r in reports]
        swap_ret = [(r["methods"][name].get("swap_last") or [])[:-1] for r in reports]
        # the untouched model's answers to the swapped questions, one per context
        base_swap = [r.get("base_swap_last") or [] for r in reports]
        if all(swap_imm) and all(len(x) == len(y) for x, y in zip(swap_imm, imm)):
            entry["immediate_swapped"] = asdict(pooled_bootstrap_ci(swap_imm))
            entry.update(paired_summary("immediate_minus_swapped", imm, swap_imm))
            # What a commit adds to the unseen entity's answers, over the untouched model's
            # answers to the same swapped questions: the entity-independent part of the gain.
            if all(len(b) == len(x) for b, x in zip(base_swap, swap_imm)):
                entry.update(paired_summary("immediate_swapped_minus_base", swap_imm,
                                            base_swap))
        if all(swap_ret) and all(len(x) == len(y) for x, y in zip(swap_ret, ret)):
            entry["retention_swapped"] = asdict(pooled_bootstrap_ci(swap_ret))
            if all(len(b) == len(x) + 1 for b, x in zip(base_swap, swap_ret)):
                entry.update(paired_summary("retention_swapped_minus_base", swap_ret,
                                            [b[:-1] for b in base_swap]))
        entry.update(_closed_set_summary(reports, name))
        legal = [r["methods"][name].get("legal_final") for r in reports]
        base_legal = [r.get("base_legal") for r in reports]
        if all(x is not None for x in legal + base_legal):
            entry["legal_final"] = sum(legal) / len(legal)
            entry["legal_untouched"] = sum(base_legal) / len(base_legal)
        hist = [r["methods"][name].get("layer_histogram") for r in reports]
        if all(h is not None for h in hist):
            entry["layer_histogram"] = [sum(x) for x in zip(*hist)]
        out[name] = entry
    return out


def seeds_markdown(report: dict) -> str:
    """The seed-pooled table: every method beside the controls, then the paper."""
    seeds = report["seeds"]
    lines = [f"Seeds {seeds[0]}..{seeds[-1]} ({len(seeds)}); EM in %, mean [95% CI] over "
             "seeds x evaluation contexts; differences paired on the same contexts, with the "
             "t-interval of the seeds' differences in brackets where recorded.", "",
             "| method | immediate | immediate, entity swapped | retention | retention, "
             "entity swapped | retention - untouched model | retention - untrained policy | "
             "retention - fixed last layer | immediate - sequential FT | legal answers after "
             "the stream | paper imm. | paper ret. |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, e in report["summary"].items():
        p = PAPER.get(name, {})
        legal = (f"{100 * e['legal_final']:.0f}% (untouched {100 * e['legal_untouched']:.0f}%)"
                 if "legal_final" in e else "-")
        cells = " | ".join(format_summary(e, k) for k in (
            "immediate", "immediate_swapped", "retention", "retention_swapped",
            "retention_minus_base", "retention_minus_untrained_policy",
            "retention_minus_fixed_last", "immediate_minus_sequential_ft"))
        lines.append(f"| {label(name)} | {cells} | {legal} | "
                     f"{_pct(p.get('immediate'))} | {_pct(p.get('retention'))} |")
    lines += ["", "Entity swapped: the same questions about an unseen entity of the same kind; "
              "what remains is what the template, the value set and recency give without "
              "knowing the entity.", "The paper's numbers are on SQuAD with Qwen-scale models that answer part of "
              "SQuAD closed-book before any update, so its retention includes prior knowledge; "
              "sandbox entities are unseen, so here retention net of the untouched model is "
              "the like-for-like quantity. Batch TTT trains once on the whole stream: its "
              "'immediate' is its final accuracy."]
    gains = {name: e for name, e in report["summary"].items()
             if "immediate_swapped_minus_base" in e}
    if gains:
        lines += ["", "Where the immediate gain comes from: each method's answers net of the "
                  "untouched model's on the same questions, for the context's own entity and "
                  "for the unseen entity swapped in. A gain that remains with the entity "
                  "swapped is the attribute's recently written value, not the entity's fact; "
                  "share = swapped gain / own gain (ratio of the means; only where the own "
                  "gain's interval is above zero). The swapped questions are those that name "
                  "their entity (on the sandbox, all of them).", "",
                  "| method | immediate - untouched | swapped - untouched (swapped) | share | "
                  "retention - untouched | swapped - untouched (swapped) | share |",
                  "|---|---|---|---|---|---|---|"]

        def share(e: dict, own: str, swapped: str) -> str:
            # a ratio to a gain that may be zero means nothing
            if own not in e or swapped not in e or e[own]["low"] <= 0:
                return "- (no gain)"
            return f"{100 * e[swapped]['mean'] / e[own]['mean']:.0f}%"
        for name, e in gains.items():
            lines.append(f"| {label(name)} | "
                         f"{format_summary(e, 'immediate_minus_base')} | "
                         f"{format_summary(e, 'immediate_swapped_minus_base')} | "
                         f"{share(e, 'immediate_minus_base', 'immediate_swapped_minus_base')} | "
                         f"{format_summary(e, 'retention_minus_base')} | "
                         f"{format_summary(e, 'retention_swapped_minus_base')} | "
                         f"{share(e, 'retention_minus_base', 'retention_swapped_minus_base')} |")
    mc = {name: e for name, e in report["summary"].items() if "mc_immediate" in e}
    if mc:
        lines += ["", "Closed-set multiple choice: the attribute's legal values ranked by "
                  "log-likelihood after the question (a fact can move the ranking before "
                  "greedy decoding produces it); % correct, mean [95% CI], paired on the same "
                  "contexts.", "",
                  "| method | MC immediate | MC retention | MC retention - untouched model | "
                  "MC retention - untrained policy | MC retention - fixed last layer | "
                  "chance |", "|---|---|---|---|---|---|---|"]
        for name, e in mc.items():
            cells = " | ".join(format_summary(e, k) for k in (
                "mc_immediate", "mc_retention", "mc_retention_minus_base",
                "mc_retention_minus_untrained_policy", "mc_retention_minus_fixed_last"))
            lines.append(f"| {label(name)} | {cells} | {100 * e['mc_chance']:.1f} |")
    held = report.get("held_out_pairs")
    if held:
        lines.append(f"- Held-out preference pairs (best-of-K on the evaluation streams, "
                     f"n = {held['n']}): the meta-trained policy ranks "
                     f"{100 * held['trained']:.1f}% right, the untrained one "
                     f"{100 * held['untrained']:.1f}% (target > 60%).")
    for name, e in report["summary"].items():
        if "layer_histogram" in e:
            lines.append(f"- {label(name)}: layers chosen, summed over seeds "
                         f"{e['layer_histogram']}")
    return "\n".join(lines) + "\n"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def squad_markdown(report: dict) -> str:
    """The measured table next to the paper's numbers."""
    lines = ["| method | immediate EM | retention EM | final EM (all) | immediate F1 | "
             "retention F1 | paper immediate | paper retention |",
             "|---|---|---|---|---|---|---|---|"]
    for name, e in report["methods"].items():
        p = PAPER.get(name, {})
        lines.append(f"| {name} | {_pct(e['em']['immediate'])} | {_pct(e['em']['retention'])} "
                     f"| {_pct(e['em']['final_all'])} | {_pct(e['f1']['immediate'])} | "
                     f"{_pct(e['f1']['retention'])} | {_pct(p.get('immediate'))} | "
                     f"{_pct(p.get('retention'))} |")
    lines.append("")
    lines.append(f"Closed-book EM of the untouched model on the evaluation stream: "
                 f"{_pct(report['base_closed_book'])}. Layers: {report['num_layers']}.")
    for name in filter(from_policy, SCOL_METHODS.names()):
        if name in report["methods"] and "layer_histogram" in report["methods"][name]:
            lines.append(f"{name} layer histogram: {report['methods'][name]['layer_histogram']}")
    return "\n".join(lines) + "\n"
