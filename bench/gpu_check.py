"""One prepared check on one CUDA GPU: the delta-rule op against fla's kernel, and each method
one step at the full Qwen2.5-0.5B shape (random weights; bf16 and fp32) beside its baseline
(``plasticlm.experiments.bench.shapes``), with time and peak GPU memory.

Run through ``bench/gpu_check.sh`` (it sets the import path); CI never runs it. Prints one
table and, with ``--out FILE``, writes the same as JSON. Needs no download: the models are built
from the published config, with the quick sandbox's tokenizer and world (trained on first use,
or found in ``$PLASTICLM_HOME``). ``--smoke``: the same parts at tiny sizes (T = 256, 256
scored positions, the shape cut to 1 layer, batch 2), exit 1 if a part failed; without a CUDA
device it prints that it skipped and exits 0 (nothing here runs on a CPU).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable

import torch

from plasticlm.eval.lm_head import _fused_kernel, chunked_cross_entropy
from plasticlm.experiments.bench.shapes import run_shape_bench
from plasticlm.memory.fla_bridge import fla_chunk_delta_rule
from plasticlm.memory.ops import delta_rule, delta_rule_chunkwise

SHAPE = "qwen2.5-0.5b"


def measured(fn: Callable[[], object]) -> tuple[object, float, float]:
    """(result, seconds, peak GiB allocated during fn) on the current CUDA device."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0, torch.cuda.max_memory_allocated() / 2**30


def delta_rule_rows(dtype=torch.bfloat16, lengths=(2048, 8192)) -> list[dict]:
    """fla's chunk_delta_rule against the torch chunkwise op (in float32, the reference)."""
    rows = []
    kernel = fla_chunk_delta_rule()
    for t in lengths:
        gen = torch.Generator(device="cuda").manual_seed(0)
        b, h, d = 2, 14, 64
        q, k, v = (torch.randn(b, h, t, d, device="cuda", generator=gen) for _ in range(3))
        q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
        beta = torch.rand(b, h, t, device="cuda", generator=gen).sigmoid()
        inputs = (q, k, v, beta)
        for _ in range(2):  # the first call warms up
            (ref, ref_state), t_torch, _ = measured(lambda x=inputs: delta_rule_chunkwise(*x))
        row = {"T": t, "torch_chunkwise_fp32_ms": 1000 * t_torch, "fla": kernel is not None}
        if kernel is not None:
            args = [x.to(dtype) for x in (q, k, v)] + [beta.to(dtype)]
            delta_rule(*args)  # warm-up (Triton compiles)
            (o, state), t_fla, _ = measured(lambda a=args: delta_rule(*a))
            row.update({"dispatch_ms": 1000 * t_fla,
                        "max_abs_diff_o": float((o.float() - ref).abs().max()),
                        "max_abs_diff_state": float((state.float() - ref_state).abs().max()),
                        "ref_abs_max": float(ref.abs().max())})
        rows.append(row)
    return rows


def fused_ce_rows(positions: int = 4096) -> list[dict]:
    """The fused linear cross-entropy (liger-kernel or Cut Cross-Entropy, when installed)
    against the chunked torch path, the reference: loss and gradient at Qwen2.5's logits
    width, ``positions`` scored positions."""
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator(device="cuda").manual_seed(0)
        head = torch.nn.Linear(896, 151936, bias=False, device="cuda", dtype=dtype)
        model = torch.nn.Module()
        model.lm_head, model.config = head, type("C", (), {})()
        model.get_output_embeddings = lambda h=head: h
        hidden = torch.randn(positions, 896, device="cuda", dtype=dtype, generator=gen)
        targets = torch.randint(0, 151936, (positions,), device="cuda", generator=gen)
        out = {}
        for fused in (False, True):
            h = hidden.clone().requires_grad_(True)
            loss, seconds, peak = measured(lambda h=h, f=fused, m=model, y=targets:
                                           chunked_cross_entropy(m, h, y, fused=f))
            loss.backward()
            out[fused] = (float(loss.detach()), h.grad.float(), seconds, peak)
        ref, fast = out[False], out[True]
        rows.append({"dtype": str(dtype), "kernel": getattr(_fused_kernel(), "__name__", None),
                     "loss_ref": ref[0], "loss_fused": fast[0],
                     "rel_diff_loss": abs(fast[0] - ref[0]) / abs(ref[0]),
                     "max_abs_diff_grad": float((fast[1] - ref[1]).abs().max()),
                     "grad_abs_max": float(ref[1].abs().max()),
                     "chunked_ms": 1000 * ref[2], "fused_ms": 1000 * fast[2],
                     "chunked_peak_gib": ref[3], "fused_peak_gib": fast[3]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--smoke", action="store_true", help="every part at tiny sizes; exit 1 if "
                    "one failed; without CUDA: say so and exit 0")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        if args.smoke:
            print("gpu_check --smoke: skipped, no CUDA device here (every part runs on the GPU)")
            return
        raise SystemExit("gpu_check: no CUDA device here; run it on a machine with one GPU")
    # T of the delta rule, scored positions of the fused CE, the shape's layers (None: all),
    # its batch
    lengths, positions, layers, batch = ((256,), 256, 1, 2) if args.smoke else \
        ((2048, 8192), 4096, None, 8)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "python": platform.python_version(), "shape": SHAPE,
              **({"smoke": True} if args.smoke else {})}
    t0 = time.time()
    for name, fn in (("delta_rule", lambda: delta_rule_rows(lengths=lengths)),
                     ("fused_ce", lambda: fused_ce_rows(positions)),
                     ("methods_bf16", lambda: run_shape_bench(SHAPE, layers, batch, "bfloat16",
                                                              "cuda")),
                     ("methods_fp32", lambda: run_shape_bench(SHAPE, layers, batch, "float32",
                                                              "cuda"))):
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
    if args.smoke:
        failed = [name for name, part in report.items() if isinstance(part, dict)
                  and ("error" in part or any("error" in r for r in part.get("rows", [])))]
        if failed:
            sys.exit(f"gpu_check --smoke: failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
