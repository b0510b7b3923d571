"""One prepared check on one CUDA GPU: the delta-rule op against fla's kernel, and each method
one step at the full Qwen2.5-0.5B shape (random weights; bf16 and fp32) beside its baseline
(``plasticlm.shape_bench``), with time and peak GPU memory.

Run through ``bench/gpu_check.sh`` (it sets the import path); CI never runs it. Prints one
table and, with ``--out FILE``, writes the same as JSON. Needs no download: the models are built
from the published config, with the quick sandbox's tokenizer and world (trained on first use,
or found in ``$PLASTICLM_HOME``).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import traceback
from collections.abc import Callable

import torch

from plasticlm.memory.fla_bridge import fla_chunk_delta_rule
from plasticlm.memory.ops import delta_rule, delta_rule_chunkwise
from plasticlm.shape_bench import run_shape_bench

SHAPE = "qwen2.5-0.5b"


def measured(fn: Callable[[], object]) -> tuple[object, float, float]:
    """(result, seconds, peak GiB allocated during fn) on the current CUDA device."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0, torch.cuda.max_memory_allocated() / 2**30


def delta_rule_rows(dtype=torch.bfloat16) -> list[dict]:
    """fla's chunk_delta_rule against the torch chunkwise op (in float32, the reference)."""
    rows = []
    kernel = fla_chunk_delta_rule()
    for t in (2048, 8192):
        gen = torch.Generator(device="cuda").manual_seed(0)
        b, h, d = 2, 14, 64
        q, k, v = (torch.randn(b, h, t, d, device="cuda", generator=gen) for _ in range(3))
        q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
        beta = torch.rand(b, h, t, device="cuda", generator=gen).sigmoid()
        (ref, ref_state), t_torch, _ = measured(lambda: delta_rule_chunkwise(q, k, v, beta))
        (ref, ref_state), t_torch, _ = measured(lambda: delta_rule_chunkwise(q, k, v, beta))
        row = {"T": t, "torch_chunkwise_fp32_ms": 1000 * t_torch, "fla": kernel is not None}
        if kernel is not None:
            args = [x.to(dtype) for x in (q, k, v)] + [beta.to(dtype)]
            delta_rule(*args)  # warm-up (Triton compiles)
            (o, state), t_fla, _ = measured(lambda: delta_rule(*args))
            row.update({"dispatch_ms": 1000 * t_fla,
                        "max_abs_diff_o": float((o.float() - ref).abs().max()),
                        "max_abs_diff_state": float((state.float() - ref_state).abs().max()),
                        "ref_abs_max": float(ref.abs().max())})
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device here; run it on a machine with one GPU")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "python": platform.python_version(), "shape": SHAPE}
    t0 = time.time()
    for name, fn in (("delta_rule", delta_rule_rows),
                     ("methods_bf16", lambda: run_shape_bench(SHAPE, None, 8, "bfloat16", "cuda")),
                     ("methods_fp32", lambda: run_shape_bench(SHAPE, None, 8, "float32", "cuda"))):
        try:
            report[name] = fn()
        except Exception as e:  # report every part, whatever one of them does
            report[name] = {"error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc()[-3000:]}
        print(name, json.dumps(report[name], indent=1), flush=True)
    report["seconds"] = round(time.time() - t0, 1)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(f"gpu_check: {report['seconds']} s on {report['device']}")


if __name__ == "__main__":
    main()
