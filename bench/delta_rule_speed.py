"""Delta-rule speed on CPU: chunkwise vs recurrent vs transformers' torch_chunk_gated_delta_rule.

B=1, H=4, Dk=Dv=64, T in {512, 2048, 8192}; forward and forward+backward, same inputs,
outputs compared, at each thread count given. The transformers reference takes [B,T,H,D]
and always scales q by Dk^-0.5, so ours gets q * Dk^-0.5 (keys are L2-normalised
beforehand, the flag stays off).

    python bench/delta_rule_speed.py          # writes bench/results/delta_rule_speed.{json,png}
    python bench/delta_rule_speed.py --smoke  # T = 128, 1 thread, 1 rep; writes to a temp folder
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch

from plasticlm.experiments.bench.delta_rule import delta_rule_rows
from plasticlm.runtime import machine

RESULTS = Path(__file__).resolve().parent / "results"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--out", default=str(RESULTS / "delta_rule_speed.json"))
    ap.add_argument("--smoke", action="store_true",
                    help="T = 128, 1 thread, 1 rep, written to a temp folder (a quick check)")
    args = ap.parse_args()
    if args.smoke:
        args.lengths, args.reps, args.threads = [128], 1, [1]
        args.out = str(Path(tempfile.mkdtemp(prefix="bench-smoke-")) / "delta_rule_speed.json")
    rows = []
    for n in args.threads:
        torch.set_num_threads(n)
        for row in delta_rule_rows(args.lengths, args.reps, args.chunk):
            rows.append({"threads": n, **row})
            print(json.dumps({k: (float(f"{v:.4g}") if isinstance(v, float) else v)
                              for k, v in rows[-1].items()}))
    result = {"setup": {"B": 1, "H": 4, "Dk": 64, "Dv": 64, "chunk": args.chunk,
                        "threads": args.threads, **machine(),
                        "load_average_at_end": os.getloadavg()},
              "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, mode in zip(axes, ("fwd", "fwd+bwd")):
        for n, style in zip(args.threads, ("-", "--", ":", "-.")):
            sub = [r for r in rows if r["mode"] == mode and r["threads"] == n]
            for name, color in (("chunkwise", "C0"), ("recurrent", "C1"), ("transformers", "C2")):
                ax.plot([r["T"] for r in sub], [r[f"{name}_s"] for r in sub], style, color=color,
                        marker="o", label=f"{name}, {n} thread(s)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel("seconds")
        ax.set_title(f"delta rule {mode}, B=1 H=4 D=64")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
