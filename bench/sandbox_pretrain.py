"""Pre-train the sandbox model family and print/plot its report.

    python bench/sandbox_pretrain.py [--preset sandbox] [--force] [--threads N] [--out DIR]
    python bench/sandbox_pretrain.py --smoke   # the quick preset; report to a temp folder

Trains the preset when its report is missing (or with --force), then writes
bench/results/sandbox_pretrain.json (the report) and bench/results/sandbox_pretrain.png
(held-out MC accuracy per domain and head/torso/tail for each model, chance at 25%).
``--smoke``: the quick preset (its cached family, or seconds of training when missing), its
report and plot written to a temp folder.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).resolve().parent / "results"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(report["models"])
    domains = sorted(k.split("/", 1)[1] for k in report["models"][models[0]]["mc_core_heldout"]
                     if k.startswith("domain/"))
    groups = ["all", *[f"domain/{d}" for d in domains], "bucket/head", "bucket/torso",
              "bucket/tail"]
    fig, ax = plt.subplots(figsize=(11, 4))
    width = 0.8 / len(models)
    for i, name in enumerate(models):
        table = report["models"][name]["mc_core_heldout"]
        ax.bar([g + i * width for g in range(len(groups))],
               [table.get(k, {}).get("accuracy", 0.0) for k in groups], width, label=name)
    ax.axhline(0.25, color="k", ls="--", lw=1, label="chance")
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels([g.split("/")[-1] for g in groups], rotation=30, ha="right")
    ax.set_ylabel("held-out MC accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"sandbox preset {report['preset']!r}: questions never seen in training")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="sandbox")
    ap.add_argument("--out", default=None, help="preset folder (default: the cache)")
    ap.add_argument("--force", action="store_true", help="retrain even if a report exists")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--smoke", action="store_true", help="the quick preset; the report and "
                    "plot go to a temp folder")
    args = ap.parse_args(argv)
    results = RESULTS
    if args.smoke:
        args.preset = "quick"
        results = Path(tempfile.mkdtemp(prefix="bench-smoke-"))

    from plasticlm.runtime import set_threads
    from plasticlm.sandbox import preset_dir, pretrain_preset, probe_table

    set_threads(args.threads)
    out = Path(args.out) if args.out else preset_dir(args.preset)
    if args.force or not (out / "report.json").exists():
        t = time.time()
        pretrain_preset(args.preset, out, reuse=not args.force)
        print(f"trained in {time.time() - t:.0f} s", file=sys.stderr)
    report = json.loads((out / "report.json").read_text())
    results.mkdir(parents=True, exist_ok=True)
    (results / f"sandbox_pretrain_{args.preset}.json").write_text(json.dumps(report, indent=1))
    plot(report, results / f"sandbox_pretrain_{args.preset}.png")
    print(probe_table(report))
    receiver = report["models"].get("receiver", {})
    for k, v in sorted(receiver.get("mc_core_heldout", {}).items()):
        if k.startswith("domain/"):
            print(f"receiver {k:<28} {v['accuracy']:.3f} [{v['low']:.3f}, {v['high']:.3f}] "
                  f"(n={v['n']})")
    print(f"results in {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
