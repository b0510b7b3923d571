"""Delta-rule speed on CPU: chunkwise vs recurrent vs transformers' torch_chunk_gated_delta_rule.

B=1, H=4, Dk=Dv=64, T in {512, 2048, 8192}; forward and forward+backward, same inputs,
outputs compared. The transformers reference takes [B,T,H,D] and always scales q by
Dk^-0.5, so ours gets q * Dk^-0.5 (keys are L2-normalised beforehand, the flag stays off).

    python bench/delta_rule_speed.py      # writes bench/results/delta_rule_speed.{json,png}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from plasticlm.memory.ops import delta_rule_chunkwise, delta_rule_recurrent

RESULTS = Path(__file__).resolve().parent / "results"


def make_inputs(t, b=1, h=4, d=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, d, generator=gen)
    k = F.normalize(torch.randn(b, h, t, d, generator=gen), dim=-1)
    v = torch.randn(b, h, t, d, generator=gen)
    beta = torch.rand(b, h, t, generator=gen)
    return q, k, v, beta


def runners(chunk):
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    def chunkwise(q, k, v, beta):
        return delta_rule_chunkwise(q * q.shape[-1] ** -0.5, k, v, beta, chunk_size=chunk)

    def recurrent(q, k, v, beta):
        return delta_rule_recurrent(q * q.shape[-1] ** -0.5, k, v, beta)

    def transformers_ref(q, k, v, beta):
        b, h, t, _ = q.shape
        o, s = torch_chunk_gated_delta_rule(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), torch.zeros(b, t, h),
            beta.transpose(1, 2), chunk_size=64, output_final_state=True)
        return o.transpose(1, 2), s

    return {"chunkwise": chunkwise, "recurrent": recurrent, "transformers": transformers_ref}


def timed(fn, inputs, backward, reps):
    times, result = [], None
    for _ in range(reps):
        leaves = [x.clone().requires_grad_(backward) for x in inputs]
        start = time.perf_counter()
        if backward:
            o, s = fn(*leaves)
            (o.sum() + s.sum()).backward()
        else:
            with torch.no_grad():
                o, s = fn(*leaves)
        times.append(time.perf_counter() - start)
        result = (o.detach(), s.detach())
    return statistics.median(times), result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS / "delta_rule_speed.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fns = runners(args.chunk)
    rows = []
    for t in args.lengths:
        inputs = make_inputs(t)
        for backward in (False, True):
            row = {"T": t, "mode": "fwd+bwd" if backward else "fwd"}
            outs = {}
            for name, fn in fns.items():
                reps = 1 if name == "recurrent" and t >= 4096 else args.reps
                row[f"{name}_s"], outs[name] = timed(fn, inputs, backward, reps)
            for name in ("recurrent", "transformers"):
                row[f"max_abs_diff_o_vs_{name}"] = (outs["chunkwise"][0] - outs[name][0]).abs().max().item()
                row[f"max_abs_diff_state_vs_{name}"] = (outs["chunkwise"][1] - outs[name][1]).abs().max().item()
            row["speedup_vs_transformers"] = row["transformers_s"] / row["chunkwise_s"]
            row["speedup_vs_recurrent"] = row["recurrent_s"] / row["chunkwise_s"]
            rows.append(row)
            print(json.dumps({k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in row.items()}))
    result = {"setup": {"B": 1, "H": 4, "Dk": 64, "Dv": 64, "chunk": args.chunk, "threads": args.threads,
                        "torch": torch.__version__, "load_average_at_end": os.getloadavg()},
              "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, mode in zip(axes, ("fwd", "fwd+bwd")):
        sub = [r for r in rows if r["mode"] == mode]
        for name in fns:
            ax.plot([r["T"] for r in sub], [r[f"{name}_s"] for r in sub], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel("seconds")
        ax.set_title(f"delta rule {mode}, B=1 H=4 D=64, {args.threads} thread(s)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
