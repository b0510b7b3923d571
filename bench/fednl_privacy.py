"""What Flower's privacy parts cost FedNL on the sandbox: accuracy and bytes on the wire per
round of the plain run beside central DP, client-side DP, SecAgg+ and SecAgg+ with
client-side DP (the ``privacy`` section of the run config; Flower's own wrappers and mods).

    python bench/fednl_privacy.py [--seeds 3] [--rounds 2] [--clients 2] [--noise 1.0]
    python bench/fednl_privacy.py --smoke   # 1 seed, 1 round, 2 clients; writes nothing

Each run goes through the real ServerApp rounds and ClientApp (mods included) in one process
(``plasticlm.fednl.flower.in_process_grid``), whose grid counts every message's records in both
directions (the SecAgg+ stages included; no transport framing). Accuracy: the clients' mean
federated accuracy after the last round; with 3 or more seeds, the t-interval over seeds
(``plasticlm.eval.stats.seed_ci``). Writes bench/results/fednl_privacy.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
RESULTS = Path(__file__).resolve().parent / "results"
SETTINGS = {"plain": {}, "central DP": {"mode": "central-fixed"},
            "client DP": {"mode": "client-fixed"}, "SecAgg+": {"secagg": True},
            "SecAgg+ & client DP": {"secagg": True, "mode": "client-fixed"}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--noise", type=float, default=1.0, help="privacy.noise_multiplier")
    ap.add_argument("--clip", type=float, default=1.0, help="privacy.clipping_norm")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.seeds, args.rounds, args.clients = 1, 1, 2
    logging.disable(logging.WARNING)   # Flower's per-stage logs; the table says what matters

    from plasticlm.config import from_dict
    from plasticlm.eval.stats import seed_ci
    from plasticlm.fednl.config import FedNLConfig
    from plasticlm.fednl.flower.in_process_grid import run_in_process

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, privacy in SETTINGS.items():
            accs, per_round, seconds = [], [], []
            for seed in range(args.seeds):
                cfg = from_dict(FedNLConfig, {
                    "name": "privacy", "seed": seed, "model": "sandbox-quick:receiver",
                    "data": {"source": "sandbox-quick", "split": "dirichlet",
                             "num_clients": args.clients, "max_train": 16, "max_test": 8},
                    "train": {"rounds": args.rounds, "local_steps": 2, "batch_size": 4},
                    "aggregation": {"clip": 0.0},
                    "privacy": {**privacy, "noise_multiplier": args.noise,
                                "clipping_norm": args.clip}})
                run_dir = Path(tmp) / f"{label}-{seed}".replace(" ", "_").replace("&", "")
                t0 = time.time()
                grid = run_in_process(cfg, run_dir)
                seconds.append(time.time() - t0)
                last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
                accs.append(last["mean_fed_acc"])
                per_round.append((grid.bytes_down + grid.bytes_up, grid.messages))
            ci = seed_ci(accs)
            rows[label] = {"acc": accs, "acc_ci": [ci.mean, ci.low, ci.high],
                           "bytes_per_round": sum(b for b, _ in per_round) / len(per_round)
                           / args.rounds,
                           "messages_per_round": per_round[0][1] / args.rounds,
                           "seconds": sum(seconds) / len(seconds)}
            print(f"{label}: done ({rows[label]['seconds']:.0f} s a run)", file=sys.stderr)
    plain = rows["plain"]["bytes_per_round"]
    print(f"\n{args.clients} clients, {args.rounds} round(s), {args.seeds} seed(s), "
          f"noise_multiplier {args.noise}, clipping_norm {args.clip}\n")
    print("| setting | fed acc (%) | bytes / round | x plain | messages / round |")
    print("|---|---|---|---|---|")
    for label, r in rows.items():
        m, lo, hi = (100 * x for x in r["acc_ci"])
        acc = f"{m:.1f} [{lo:.1f}, {hi:.1f}]" if args.seeds >= 3 else f"{m:.1f}"
        print(f"| {label} | {acc} | {r['bytes_per_round']:,.0f} | "
              f"{r['bytes_per_round'] / plain:.2f} | {r['messages_per_round']:.0f} |")
    if not args.smoke:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "fednl_privacy.json").write_text(json.dumps(
            {"args": vars(args), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
