"""Truncated BPTT: does training the memory on sequences far longer than its window, read in
segments with the state carried across them, stop its cross-entropy from climbing over a
long stream?

    python bench/fednl_segments.py [--steps 80] [--seeds 3] [--long 640] [--segment 160]
    python bench/fednl_segments.py --smoke   # the quick sandbox, tiny sizes; writes nothing

The FedNL theta (memory in every layer of the frozen v2 receiver, window 16) is trained
centrally on the seven NIAH-7 clients' samples pooled (the mechanism FedNL federates), at
equal steps and batch, two ways:

- ``short, one forward``: 160-token samples, each read in one parallel forward (what
  ``plasticlm fednl experiment niah`` trains on);
- ``long, segments``: ``--long``-token samples read in ``--segment``-token segments, the
  window cache and memory carried from segment to segment and the gradient cut at each
  boundary (``train.segment_tokens``), so the state the answer is read from has
  already taken in hundreds of tokens, as it has in use.

Each theta then reads the five client streams (about 4K tokens of unseen entities' passages
and answered questions, one memory never reset; the P4 measure of the FedNL issue: CE per
256-token bucket divided by the first bucket's) and answers the NIAH-7 test samples (160
tokens, 4-way choice, chance 25%). The control is the untrained window: the frozen receiver
at the same window with no memory. Intervals: t over seeds for the stream CE, bootstrap over
samples pooled over seeds for NIAH. Writes bench/results/fednl_segments.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--long", type=int, default=640, help="tokens per long training sample")
    ap.add_argument("--segment", type=int, default=160, help="tokens per segment")
    ap.add_argument("--train-per-client", type=int, default=96)
    ap.add_argument("--out", default=str(RESULTS / "fednl_segments.json"))
    ap.add_argument("--smoke", action="store_true", help="the quick sandbox at tiny sizes "
                    "(1 seed, 2 steps, 4 samples per client), written to a temp folder")
    args = ap.parse_args(argv)
    # the sandbox world and receiver; the short samples' length; test samples per client
    # and the stream CE's bucket
    data, model_spec, short, max_test, bucket = "sandbox", "sandbox:receiver", 160, 48, 256
    if args.smoke:  # the quick world's tokenizer is short: its NIAH-7 samples need 400 tokens
        data, model_spec, short, max_test, bucket = ("sandbox-quick", "sandbox-quick:receiver",
                                                     400, 2, 64)
        args.steps, args.batch, args.seeds, args.long, args.segment = 2, 2, 1, 800, 400
        args.train_per_client = 4
        args.out = str(Path(tempfile.mkdtemp(prefix="bench-smoke-")) / "fednl_segments.json")

    from plasticlm.config import override
    from plasticlm.data.context_tasks import load_client_streams
    from plasticlm.eval import format_ci, pooled_bootstrap_ci, seed_ci
    from plasticlm.experiments.fednl.streaming import stream_ce
    from plasticlm.experiments.fednl.variants import ExperimentConfig, Variant, federated_config
    from plasticlm.fednl.build import build_model, tasks_for
    from plasticlm.fednl.local_round import local_update
    from plasticlm.fednl.task import NIAHTask
    from plasticlm.fednl.theta import get_theta, set_theta
    from plasticlm.runtime import set_threads
    from plasticlm.sandbox import resolve_data_spec

    set_threads()
    cfg = ExperimentConfig(experiment="niah")
    cfg = ExperimentConfig(experiment="niah", bucket_tokens=bucket, run=override(cfg.run, {
        "model": model_spec, "data.source": data, "data.max_train": args.train_per_client,
        "data.max_test": max_test, "data.niah_length": short}))
    window = cfg.run.method.window
    rows = {"window, untrained (control)": None,
            "short, one forward": (cfg.run.data.niah_length, 0),
            "long, segments": (args.long, args.segment)}
    streams = load_client_streams(resolve_data_spec(data) / "client_streams.jsonl")
    out = {"config": vars(args), "rows": {}}
    t0 = time.time()
    for label, how in rows.items():
        ce_last, niah = [], []
        for seed in range(args.seeds if how else 1):
            v = Variant("fednl", (("method.name", "fednl"),)) if how else \
                Variant("untrained", (("method.name", "fedavg"),), trained=False)
            test_cfg = federated_config(cfg, v, seed, Path("/nonexistent"))
            model, tok = build_model(test_cfg)
            tests = tasks_for(test_cfg)
            losses = []
            if how:
                length, segment = how
                train_cfg = override(test_cfg, {"data.niah_length": length})
                pooled = NIAHTask("pooled", "pooled",
                                  [s for t in tasks_for(train_cfg) for s in t.train], [])
                local_cfg = override(test_cfg, {"train.local_steps": args.steps,
                                                "train.batch_size": args.batch,
                                                "train.segment_tokens": segment})
                theta, metrics = local_update(model, tok, pooled, get_theta(model), {},
                                              local_cfg, seed)
                set_theta(model, theta)
                losses = [metrics["train_loss_first"], metrics["train_loss_last"]]
            curves = [stream_ce(model, tok, segs, cfg.bucket_tokens, window)
                      for segs in streams.values()]
            k = min(len(c) for c in curves)
            ce_last.append(sum(c[k - 1] / c[0] for c in curves) / len(curves))
            niah.append([x for t in tests for x in t.correct(model, tok)])
            print(f"{label} seed {seed}: stream CE last/first {ce_last[-1]:.3f}, NIAH-7 "
                  f"{100 * sum(niah[-1]) / len(niah[-1]):.1f}%, loss {losses} "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
        acc = pooled_bootstrap_ci([[100 * x for x in n] for n in niah])
        out["rows"][label] = {"stream_ce_last": dataclasses.asdict(seed_ci(ce_last)),
                              "stream_ce_last_per_seed": ce_last,
                              "niah7": dataclasses.asdict(acc)}
    lines = ["| theta (window 16, memory in every layer) | normalised stream CE, last bucket "
             "[95% CI over seeds] | NIAH-7 accuracy, % [95% CI] |", "|---|---|---|"]
    for label, r in out["rows"].items():
        lines.append(f"| {label} | {format_ci(seed_ci(r['stream_ce_last_per_seed']), 1, 3)} | "
                     f"{r['niah7']['mean']:.1f} [{r['niah7']['low']:.1f}, "
                     f"{r['niah7']['high']:.1f}] |")
    out["table"] = "\n".join(lines)
    out["seconds"] = round(time.time() - t0)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(out["table"])
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
