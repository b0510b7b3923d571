"""``plasticlm bench``: every performance comparison side by side, each against its peer."""

from __future__ import annotations

import argparse

from plasticlm.cli.options import SIZE, THREADS, add_option_config, add_overwrite_option, non_empty
from plasticlm.outputs import prepare_output


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="performance comparisons, each a ratio against a named "
                       "peer (JSON + PNG)",
                       description="Delta rule (chunkwise vs transformers' reference and the "
                       "recurrent form, fwd and fwd+bwd), inference state (memory stream vs "
                       "full KV cache), bytes per round (FedNL vs LoRA-FedAvg and full FedAvg), "
                       "in one run; writes OUT/bench.json, OUT/bench.png and OUT/report/index.html.")
    p.add_argument("--out", default="bench/results/bench", help="folder for the results")
    p.add_argument("--quick", action="store_true", help="short lengths (a smoke test)")
    p.add_argument("--threads", type=THREADS, default=1, help="torch threads for the timings")
    p.add_argument("--shape", metavar="NAME", type=non_empty, help="instead: each method's step time and peak "
                   "memory beside its baseline's at a published shape (qwen2.5-0.5b, "
                   "qwen2.5-1.5b, qwen3-0.6b, llama-3.2-1b), random weights")
    p.add_argument("--layers", type=SIZE, default=None, help="with --shape: cut to this many "
                   "layers (default: all)")
    p.add_argument("--batch", type=SIZE, default=4, help="with --shape: training batch")
    p.add_argument("--device", default="cpu", type=non_empty, help="with --shape: cpu or cuda[:N]")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="with --shape: the base models' dtype (SCoL's stays float32)")
    add_overwrite_option(p, "out")
    add_option_config(p)
    p.set_defaults(func=_bench)


def _bench(args) -> int:
    if args.shape:
        return _shape_bench(args)
    from plasticlm.experiments.bench import run_bench
    from plasticlm.run_report import write_report

    report = run_bench(args.out, quick=args.quick, threads=args.threads)
    print("\n".join(report["lines"]))
    print(f"report: {write_report(args.out)[0]} ({report['seconds']} s)")
    return 0


def _shape_bench(args) -> int:
    import json

    import torch

    from plasticlm.errors import PlasticError
    from plasticlm.experiments.bench.shapes import run_shape_bench
    from plasticlm.models.shapes import check_shape
    from plasticlm.runs import write_text_atomic

    check_shape(args.shape, args.layers)
    if args.batch < 1 or args.threads < 1:
        raise PlasticError("--batch and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    report = run_shape_bench(args.shape, args.layers, args.batch, args.dtype, args.device)
    print("\n".join(report["lines"]))
    out = prepare_output(args.out, "run", hint="give another --out")
    name = f"shape_{args.shape}_L{args.layers or 'all'}_{args.dtype}_{args.device}.json"
    write_text_atomic(out / name, json.dumps(report, indent=1) + "\n")
    print(f"wrote {out / name}")
    return 0
