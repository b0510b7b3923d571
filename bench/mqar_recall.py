"""MQAR recall: a 2-layer tiny Llama with delta-rule memory vs the same model with the window alone.

Both variants train from scratch with the same budget (steps, batch, learning rate, seed,
data): every parameter trainable (base and theta), cross-entropy on labelled positions only.
The softmax window is shorter than the key-value span, so the window alone cannot see most
pairs when their key is queried; the memory has to carry them. Training back-propagates
through the memory trajectory with the chunkwise delta rule. Options: MQARConfig fields.

    python bench/mqar_recall.py            # writes bench/results/mqar.json and mqar.png
    python bench/mqar_recall.py --smoke    # a tiny model, 2 steps; writes to a temp folder
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from plasticlm.config import parse_value  # noqa: E402
from plasticlm.experiments.memory.mqar import run_mqar  # noqa: E402
from plasticlm.experiments.memory.mqar_config import MQARConfig  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# --smoke: every part (both variants, the curve, the test settings, the plot) at tiny sizes
SMOKE = dict(steps=2, batch=2, seq_len=32, num_kv=4, window=4, vocab=64, hidden=32, heads=2,
             rank=2, eval_every=1, test_examples=4)


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setup = results["setup"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("window_only", f"window {setup['window']} only"),
                       ("memory", f"window {setup['window']} + memory")):
        curve = results[key]["curve"]
        ax.plot([c["step"] for c in curve], [c["acc"] for c in curve], marker="o", label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"MQAR accuracy (seq {setup['seq_len']}, {setup['num_kv']} pairs)")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = MQARConfig()
    for f in dataclasses.fields(MQARConfig):
        value = getattr(defaults, f.name)
        ap.add_argument("--" + f.name.replace("_", "-"), default=value,
                        type=parse_value if isinstance(value, bool) else type(value))
    ap.add_argument("--out", default=str(RESULTS / "mqar.json"))
    ap.add_argument("--smoke", action="store_true", help="a tiny model and 2 steps, written to "
                    "a temp folder (a quick check)")
    args = vars(ap.parse_args())
    out = Path(args.pop("out"))
    if args.pop("smoke"):
        args.update(SMOKE)
        out = Path(tempfile.mkdtemp(prefix="bench-smoke-")) / "mqar.json"
    results = run_mqar(MQARConfig(**args))
    for key in ("window_only", "memory"):
        print(key, json.dumps(results[key]["test_accuracy"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
