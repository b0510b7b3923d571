"""What one inner update writes, layer by layer: a passage's facts in its own words, in a
paraphrase, and as the answer to a question.

    .venv/bin/python bench/scol_depth.py --passages 40

Each of ``--passages`` unseen-entity passages of the sandbox world is learned by one LoRA
update (SCoL's inner update) of the untouched receiver, on one layer at a time (and on all
layers). Each closed attribute is then scored by closed-set ranking (the attribute's legal
values ranked by log-likelihood) after three prompts: the passage's own statement cut before
the value ("verbatim"), another paraphrase of it ("paraphrase"), and the QA prompt
("question"). Peer: the untouched receiver on the same prompts. A fact that the update wrote
but that questions cannot read shows as verbatim >> question.

Writes bench/results/scol_depth.{json,md,png}. ``--smoke``: the quick preset's receiver and
world, 1 passage, 1 step per setting, written to a temp folder.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Settings: the inner update's previous default and a stronger MLP update (bench/results/scol_sweep*).
SETTINGS = {
    "attention, lr 1e-3, 12 steps": {"modules": "attention", "lr": 1e-3, "steps": 12},
    "MLP, lr 3e-3, 30 steps": {"modules": "mlp", "lr": 3e-3, "steps": 30},
}
FORMS = ("verbatim", "paraphrase", "question")


def score(model, tok, items: list[dict]) -> dict[str, list[float]]:
    """Per form: 1/0 per item that has it (legal values ranked after the prompt)."""
    from plasticlm.eval import closed_set_accuracy

    out = {}
    for form in FORMS:
        have = [it for it in items if it[form]]
        res = closed_set_accuracy(model, tok, [it[form] for it in have],
                                  [it["values"] for it in have], [it["answer"] for it in have])
        out[form] = list(res.correct)
    return out


def plot(report: dict, out: Path) -> None:
    """``scol_depth.png``: closed-set accuracy by the layer updated, per setting and form."""
    from plasticlm.plotting import plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    for name in SETTINGS:
        for f, style in (("verbatim", ":"), ("question", "-")):
            pts = [(int(e["layers"]), 100 * e[f]["mean"]) for e in report["rows"]
                   if e["setting"] == name and e["layers"] != "all"]
            ax.plot(*zip(*pts), style, marker="o", label=f"{name}: {f}")
    base = next(e for e in report["rows"] if e["setting"] == "untouched")
    ax.axhline(100 * base["question"]["mean"], color="grey", lw=0.8,
               label="untouched: question")
    ax.set_xlabel("layer updated")
    ax.set_ylabel("closed-set accuracy (%)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(out / "scol_depth.png", dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passages", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON")
    ap.add_argument("--smoke", action="store_true", help="the quick preset, 1 passage, 1 step "
                    "per setting, written to a temp folder (a quick check)")
    args = ap.parse_args()
    preset, settings = "sandbox", SETTINGS
    if args.smoke:
        preset, args.passages, args.threads = "quick", 1, 1
        settings = {name: {**s, "steps": 1} for name, s in SETTINGS.items()}
        args.out, args.plot_only = tempfile.mkdtemp(prefix="bench-smoke-"), False
    if args.plot_only:
        plot(json.loads((Path(args.out) / "scol_depth.json").read_text()), Path(args.out))
        return

    import torch

    from plasticlm.eval import bootstrap_ci, format_ci
    from plasticlm.eval.ci import CI
    from plasticlm.experiments.scol.one_update import probe_items
    from plasticlm.models import load_causal_lm
    from plasticlm.sandbox import get_preset, sandbox_model
    from plasticlm.sandbox.world import generate_world
    from plasticlm.scol.consolidate import MODULES, LoraTrainConfig, adapt_lora, context_windows

    torch.set_num_threads(args.threads)
    t0 = time.time()
    world = generate_world(get_preset(preset).world)
    model, tok = load_causal_lm(sandbox_model("receiver", preset), dtype="float32", device="cpu")
    n_layers = model.config.num_hidden_layers
    items = probe_items(world, args.passages)
    groups = {f: [it["entity"] for it in items if it[f]] for f in FORMS}
    untouched = score(model, tok, items)
    rows = [{"setting": "untouched", "layers": "-", **{
        f: untouched[f] for f in FORMS}}]
    passages = list(dict.fromkeys(it["passage"] for it in items))
    for name, setting in settings.items():
        lora = LoraTrainConfig(target_modules=MODULES[setting["modules"]], lr=setting["lr"],
                               steps=setting["steps"], replay=0)
        for layers in [[i] for i in range(n_layers)] + [list(range(n_layers))]:
            per = {f: [] for f in FORMS}
            for k, text in enumerate(passages):
                adapted, _ = adapt_lora(model, layers, context_windows(tok, text, lora.max_tokens),
                                        lora, seed=k)
                got = score(adapted, tok, [it for it in items if it["passage"] == text])
                for f in FORMS:
                    per[f] += got[f]
            label = "all" if len(layers) == n_layers else str(layers[0])
            rows.append({"setting": name, "layers": label, **per})
            print(f"{name}, layer {label}: " + ", ".join(
                f"{f} {100 * sum(per[f]) / len(per[f]):.1f}%" for f in FORMS)
                + f" ({time.time() - t0:.0f} s)", flush=True)

    summary = []
    for r in rows:
        entry = {"setting": r["setting"], "layers": r["layers"]}
        for f in FORMS:
            entry[f] = asdict(bootstrap_ci(r[f], groups=groups[f]))
            entry[f"{f}_minus_untouched"] = asdict(bootstrap_ci(
                r[f], baseline=untouched[f], groups=groups[f]))
        summary.append(entry)
    chance = sum(1 / len(it["values"]) for it in items) / len(items)
    report = {"passages": args.passages, "items": {f: len(groups[f]) for f in FORMS},
              "chance": chance, "rows": summary, "seconds": round(time.time() - t0, 1),
              "threads": args.threads}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scol_depth.json").write_text(json.dumps(report, indent=1) + "\n")

    lines = [f"One inner update per passage ({args.passages} unseen passages, "
             f"{len(items)} closed attributes; chance {100 * chance:.1f}%): closed-set "
             "accuracy, % [95% CI, entities resampled], by the layer the update wrote to.", "",
             "| update | layer | verbatim statement | paraphrase | question | question - "
             "untouched |", "|---|---|---|---|---|---|"]
    for e in summary:
        cells = [format_ci(CI(**e[f])) for f in FORMS]
        diff = ("-" if e["setting"] == "untouched"
                else format_ci(CI(**e["question_minus_untouched"])))
        lines.append(f"| {e['setting']} | {e['layers']} | {' | '.join(cells)} | {diff} |")
    (out / "scol_depth.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    plot(report, out)

if __name__ == "__main__":
    main()
