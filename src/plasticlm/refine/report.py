"""FedRefine's tables, plots and the paper's numbers: the mode table with its link model, and
the transfer table where every row stands beside its control."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from plasticlm.eval import CI, format_ci, format_summary, paired_summary, pooled_bootstrap_ci
from plasticlm.plotting import plt

# The paper's numbers (FedRefine: Federated Inference for Heterogeneous LLM Communication
# and Collaboration), set beside ours in the report.
PAPER = {
    "multi_all_vs_alone_pct": 21.2,
    "private_vs_nonprivate_pct": -3.0,
    "c2c_vs_t2t_pct": 15.0,
    "cache_bytes_per_token": 88 * 1024,
    "text_bytes_per_token": 16,
}


LINK_MB_PER_S = (1.0, 10.0, 100.0)   # link speeds of the latency model


LINK_RTT_MS = 20.0                     # one round trip per answer that uses the network


def link_latency_ms(compute_ms: float, wire_bytes: float, mb_per_s: float,
                    rtt_ms: float = LINK_RTT_MS) -> float:
    """Latency of an answer over a link: compute + one round trip + bytes / bandwidth (a mode
    that sends nothing pays no round trip)."""
    if wire_bytes <= 0:
        return compute_ms
    return compute_ms + rtt_ms + 1000.0 * wire_bytes / (mb_per_s * 1e6)


def crossover_mb_per_s(a: dict, b: dict) -> float | None:
    """The bandwidth (MB/s) above which mode ``a`` (more bytes, less compute) answers faster
    than mode ``b``; None when one is faster at every bandwidth. Each is a result entry with
    ``latency_ms`` and ``wire_bytes``."""
    extra_bytes = a["wire_bytes"] - b["wire_bytes"]
    saved_ms = b["latency_ms"] - a["latency_ms"]
    if extra_bytes <= 0 or saved_ms <= 0:
        return None
    return 1000.0 * extra_bytes / (saved_ms * 1e6)


def markdown_table(report: dict) -> str:
    """The mode table (accuracy, time to first token, latency with and without a link, bytes)
    as Markdown."""
    speeds = " | ".join(f"ms at {s:g} MB/s" for s in LINK_MB_PER_S)
    lines = [f"| mode | accuracy | TTFT ms | latency ms (compute) | {speeds} | bytes on the wire |",
             "|---|---|---|---|" + "---|" * len(LINK_MB_PER_S) + "---|"]
    for label, e in report["results"].items():
        acc = f"{100 * e['accuracy']:.1f}%"
        if "partner_accuracy" in e:
            acc += f" (partner {100 * e['partner_accuracy']:.1f}%)"
        linked = " | ".join(f"{link_latency_ms(e['latency_ms'], e['wire_bytes'], s):.1f}"
                            for s in LINK_MB_PER_S)
        lines.append(f"| {label} | {acc} | {e['ttft_ms']:.1f} | {e['latency_ms']:.1f} | "
                     f"{linked} | {e['wire_bytes']:.0f} |")
    results = report["results"]
    if "c2c" in results and "t2t" in results:
        cross = crossover_mb_per_s(results["c2c"], results["t2t"])
        lines += ["", f"Link model: compute + {LINK_RTT_MS:g} ms round trip + bytes / bandwidth. "
                  + (f"C2C answers faster than T2T above {cross:.3f} MB/s."
                     if cross is not None else
                     "C2C vs T2T: one is faster at every bandwidth (see the columns).")]
    ours, paper = report["ours_vs_paper"]["ours"], report["ours_vs_paper"]["paper"]
    lines += ["", "| comparison | ours | paper |", "|---|---|---|",
              f"| all transmitters vs alone | {ours['multi_all_vs_alone_pp']:+.1f} pp | "
              f"+{paper['multi_all_vs_alone_pct']}% |",
              f"| private vs non-private | {ours['private_vs_nonprivate_pp']:+.1f} pp | "
              f"{paper['private_vs_nonprivate_pct']}% |",
              f"| C2C vs T2T accuracy | {ours['c2c_vs_t2t_pp']:+.1f} pp | "
              f"+{paper['c2c_vs_t2t_pct']}% |",
              f"| C2C / T2T latency | {ours['c2c_vs_t2t_latency_ratio']:.2f}x | "
              "much lower |"]
    if "draft_only_c2c_vs_alone_pp" in ours:
        lines.append(f"| C2C draft-only vs alone | {ours['draft_only_c2c_vs_alone_pp']:+.1f} pp "
                     "| - |")
    leak = report.get("leakage")
    if leak:
        lines += ["", f"Leakage (layer {leak['layer']} inversion, token recall of the original "
                  f"prompt): raw {100 * leak['raw_recall']:.1f}%, rephrased "
                  f"{100 * leak['rephrased_recall']:.1f}% (n={leak['n']})."]
    sizes = report["fuser_sizes"]
    lines += ["", "| fuser | parameters | / receiver |", "|---|---|---|"]
    lines += [f"| {k} | {v['fuser_parameters']:,} | {100 * v['ratio_to_receiver']:.2f}% |"
              for k, v in sizes.items()]
    return "\n".join(lines) + "\n"


def plot_report(report: dict, folder: Path) -> list[Path]:
    """Bar charts of accuracy and latency per mode (PNG)."""
    labels = list(report["results"])
    paths = []
    for key, title, scale, name in (("accuracy", "accuracy", 100, "accuracy.png"),
                                    ("latency_ms", "latency per answer (ms)", 1, "latency.png"),
                                    ("wire_bytes", "bytes on the wire per answer", 1,
                                     "bytes.png")):
        fig, ax = plt.subplots(figsize=(8, 0.4 * len(labels) + 1.2))
        ax.barh(labels, [scale * report["results"][k][key] for k in labels])
        ax.invert_yaxis()
        ax.set_xlabel(title)
        if key == "wire_bytes":
            ax.set_xscale("symlog")
        fig.tight_layout()
        path = folder / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


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


def owner_of(label: str, extra: dict) -> tuple[list[int], int] | None:
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
             "Differences are paired on the same items, pooled over seeds; in brackets, where "
             "recorded, the t-interval of the seeds' differences (a control with one seed "
             "pairs with every seed).", "",
             "| row (4-way choice, held-out entities) | accuracy [95% CI] | minus alone | "
             "minus its control | its control | minus control, taught entities only |",
             "|---|---|---|---|---|---|"]
    for label, r in report["results"].items():
        lines.append(f"| {label} | {format_ci(CI(**r['accuracy']))} | "
                     f"{format_summary(r, 'minus_alone')} | "
                     f"{format_summary(r, 'minus_control')} | {r.get('control', '-')} | "
                     f"{format_summary(r, 'minus_control_on_taught')} |")
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


def probe_summary(extra: dict, key: str, groups: list[str]) -> tuple[dict, float, float]:
    """(rows per layer and position, best difference at fused positions, at the last token)
    of the stored probe pair ``key``: the knowing model minus the blank one, entity-clustered."""
    rows = {}
    for k, (s_, c_) in extra.get(key, {}).items():
        layer, position = k.split("|")
        d = pooled_bootstrap_ci([s_], baseline_per_seed=[c_], groups_per_seed=[groups])
        rows[f"layer {layer}, {position}"] = {
            "specialist": sum(s_) / len(s_), "control": sum(c_) / len(c_),
            "difference": dataclasses.asdict(d)}
    fused = [r["difference"]["mean"] for k, r in rows.items() if not k.endswith(", last")]
    last = [r["difference"]["mean"] for k, r in rows.items() if k.endswith(", last")]
    return rows, max(fused, default=float("nan")), max(last, default=float("nan"))


def transfer_results(scores: dict[str, list[list[float]]], extra: dict, groups: list[str]
                     ) -> dict:
    """Per row: accuracy, minus alone and minus its control (and, for a transmitter taught a
    part of the entities, minus its control on that part), entity-clustered bootstrap
    intervals pooled over seeds, differences paired on the same items."""
    results = {}
    for label, per_seed in scores.items():
        if not per_seed:
            continue
        g = [groups] * len(per_seed)
        entry = {"accuracy": dataclasses.asdict(pooled_bootstrap_ci(per_seed, groups_per_seed=g)),
                 "seeds": len(per_seed)}
        alone = scores["alone"] * len(per_seed)
        entry.update(paired_summary("minus_alone", per_seed, alone, g))
        control = control_of(label)
        if control in scores and len(scores[control]) >= 1:
            ctrl = scores[control]
            ctrl = (ctrl * len(per_seed))[: len(per_seed)] if len(ctrl) < len(per_seed) else \
                ctrl[: len(per_seed)]
            entry["control"] = control
            entry.update(paired_summary("minus_control", per_seed, ctrl, g))
            owner = owner_of(label, extra)
            if owner is not None:
                mine = [o == owner[1] for o in owner[0]]
                keep = [[x for x, m in zip(row, mine) if m] for row in per_seed]
                base = [[x for x, m in zip(row, mine) if m] for row in ctrl]
                sub = [[gr for gr, m in zip(groups, mine) if m]] * len(per_seed)
                entry.update(paired_summary("minus_control_on_taught", keep, base, sub))
        results[label] = entry
    return results
