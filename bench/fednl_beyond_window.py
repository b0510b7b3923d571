"""Where test-time memory matters: questions whose evidence lies beyond the attention window.

    python bench/fednl_beyond_window.py --task openbook|niah [--preset sandbox] [--window 16]
        [--steps 80] [--seeds 3]
    python bench/fednl_beyond_window.py --smoke [--task niah]   # the quick sandbox, 2 steps

``openbook``: the frozen sandbox receiver reads an unseen entity's passage, 40-80 words of
neutral filler, then a question about the passage (the world's open-book items,
`plasticlm.sandbox.tasks`); train on the items of half the unseen entities, test on the
other half. ``niah``: single-needle samples of 96 tokens with the needle in the first 40%
(fresh needles for training and testing). Either way the evidence is far outside a W-token
window. Only theta trains (centrally: the mechanism FedNL federates), and every variant is
scored by 4-way choice by log-likelihood (chance 25%):

- window, untrained: the frozen receiver with W-token attention (the control);
- window + LoRA: FedAvg's theta (LoRA r8 on q/k/v) at the same window (equal O(1) state);
- memory (FedNL theta): delta-rule memory in every layer, gate open, conv 4, LoRA r8;
- memory, recurrence removed: the same theta, each token writes into an empty state;
- full attention + LoRA: the O(T) reference, whose KV cache grows with the context.

``--ablation`` trains the memory variant once per change of one design choice instead
(the ablation that locates what the memory needs): LoRA on the memory's q/k/v only vs
shared with the attention, gate opened (logit 0) vs the old -3, per-head vs input-dependent
gate, beta learned vs fixed at 0.5, the short convolution on vs off, decay off vs on, the
convex vs the additive mix (with and without an RMS-normalised memory read); ``--only``
runs some of these rows.

Seeds change theta's initialisation and the batch order; intervals are entity-clustered
bootstrap intervals pooled over seeds (`plasticlm.eval.pooled_bootstrap_ci`), and the
differences are paired on the same items. Writes bench/results/fednl_beyond_window_<task>.json.
The code is `plasticlm.experiments.fednl.beyond_window` (``plasticlm demo`` runs it too); this is its CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None) -> int:
    from plasticlm.experiments.fednl.beyond_window import ABLATION, BASELINE, VARIANTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="sandbox")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--task", choices=("openbook", "niah"), default="openbook")
    ap.add_argument("--niah-length", type=int, default=96, help="niah: tokens per sample")
    ap.add_argument("--filler", default="40,80", help="openbook: filler words between passage "
                    "and question")
    ap.add_argument("--ablation", action="store_true", help="memory variants, one design "
                    "choice changed at a time (beside window + LoRA)")
    ap.add_argument("--only", default="", help="with --ablation: rows to run, separated by ; "
                    "(window + LoRA, the reference, always runs)")
    ap.add_argument("--max-test", type=int, default=400)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="default bench/results/"
                    "fednl_beyond_window_<task>.json")
    ap.add_argument("--smoke", action="store_true", help="the quick sandbox preset, 1 seed, "
                    "2 steps of 2, 4 test items, niah samples of at least 128 tokens (the quick "
                    "tokenizer needs them), written to a temp folder (a quick check)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.preset, args.steps, args.batch, args.seeds, args.max_test = "quick", 2, 2, 1, 4
        args.niah_length = max(args.niah_length, 128)   # 96 leaves no haystack on "quick"
        args.out = str(Path(tempfile.mkdtemp(prefix="bench-smoke-"))
                       / f"fednl_beyond_window_{args.task}.json")
    suffix = "_ablation" if args.ablation else ""
    args.out = args.out or str(RESULTS / f"fednl_beyond_window_{args.task}{suffix}.json")
    variants = (BASELINE, *ABLATION) if args.ablation else VARIANTS
    if args.only:
        wanted = {x.strip() for x in args.only.split(";")}
        unknown = wanted - set(ABLATION)
        if unknown or not args.ablation:
            ap.error(f"--only needs --ablation and rows of {sorted(ABLATION)}; got {sorted(unknown)}")
        variants = (BASELINE, *[v for v in ABLATION if v in wanted])

    from plasticlm.cli import setup_logging
    from plasticlm.experiments.fednl.beyond_window import beyond_window_table, run_beyond_window
    from plasticlm.runtime import set_threads
    from plasticlm.sandbox import get_preset, sandbox_model
    from plasticlm.sandbox.world import generate_world

    setup_logging("INFO")   # one progress line per seed x variant on stderr
    set_threads(args.threads)
    folder = sandbox_model("receiver", preset=args.preset)
    world = generate_world(get_preset(args.preset).world)
    lo, hi = (int(x) for x in args.filler.split(","))
    result = run_beyond_window(folder, world, args.task, variants, args.window, args.steps,
                               args.batch, args.seeds, args.max_test, args.niah_length,
                               (lo, hi), progress=True)
    report = {"task": args.task, "ablation": args.ablation, "preset": args.preset, **result}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(beyond_window_table(report))
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
