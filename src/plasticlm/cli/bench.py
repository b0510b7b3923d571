"""``plasticlm bench``: every performance comparison side by side, each against its peer."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="performance comparisons, each a ratio against a named "
                       "peer (JSON + PNG)",
                       description="Delta rule (chunkwise vs transformers' reference and the "
                       "recurrent form, fwd and fwd+bwd), inference state (memory stream vs "
                       "full KV cache), bytes per round (FedNL vs LoRA-FedAvg and full FedAvg), "
                       "in one run; writes OUT/bench.json, OUT/bench.png and OUT/index.html.")
    p.add_argument("--out", default="bench/results/bench", help="folder for the results")
    p.add_argument("--quick", action="store_true", help="short lengths (a smoke test)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the timings")
    p.set_defaults(func=_bench)


def _bench(args) -> int:
    from plasticlm.benchmarks import run_bench
    from plasticlm.run_report import write_report

    report = run_bench(args.out, quick=args.quick, threads=args.threads)
    print("\n".join(report["lines"]))
    print(f"report: {write_report(args.out)[0]} ({report['seconds']} s)")
    return 0
