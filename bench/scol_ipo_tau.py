"""Why IPO's tau decides whether the SCoL policy's greedy choice moves at all.

    .venv/bin/python bench/scol_ipo_tau.py --steps 20 --lr 3e-4 --taus 0.1 0.02

IPO drives h = (log pi(w) - log pi(l)) - (log ref(w) - log ref(l)) toward 1/(2 tau): it asks
for a fixed gain over the reference, not for the better action to be the most likely one.
When the reference's prior over layer numbers is skewed (the untrained receiver gives the
digits 0-2 about 6 nats less than 3-7 after ``layers: ``), a small target (tau 0.1: 5 nats)
can be met without the rewarded layer becoming the greedy choice.

Data: the committed layer-oracle walks (``bench/results/scol_oracle_v2.json``: 3 seeds x 8
contexts, every single layer adapted with LoRA seeds A and B and scored by the loglik
reward). IPO trains on seeds 0 and 1 (pairs of seed A's rewards) and is scored on seed 2
(pairs of seed B's rewards, greedy actions), one run per tau, same lr and steps. Peer: the
untrained policy (step 0). Writes ``bench/results/scol_ipo_tau.{json,md}``. ``--smoke``: the
same walks cut to 2 contexts per seed, 1 step, tau 0.1, written to a temporary folder.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--taus", type=float, nargs="+", default=[0.1, 0.02])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="2 contexts per seed, 1 step, tau 0.1, "
                    "written to a temporary folder")
    args = ap.parse_args()
    out, per_seed = RESULTS, None
    if args.smoke:
        args.steps, args.taus, per_seed = 1, [0.1], 2
        out = Path(tempfile.mkdtemp(prefix="bench-smoke-"))

    import torch

    from plasticlm.experiments.scol.choice_learning import choices_of, train_ipo
    from plasticlm.experiments.scol.oracle import colliding_streams
    from plasticlm.experiments.scol.setup import ExperimentConfig, load_model
    from plasticlm.runtime import set_threads
    from plasticlm.scol.action_scores import candidate_logprobs
    from plasticlm.scol.consolidate import num_layers_of
    from plasticlm.scol.policy import LayerGrammar

    set_threads(args.threads)
    walks = json.loads((RESULTS / "scol_oracle_v2.json").read_text())
    cfg = ExperimentConfig(eval_length=walks["contexts_per_seed"], seeds=len(walks["records"]))
    base, tok = load_model(cfg)
    n = num_layers_of(base)
    grammar = LayerGrammar.for_model(base, tok, n, 1)
    data = []
    for (_, stream), records in zip(colliding_streams(cfg), walks["records"]):
        if [c.id for c in stream] != [r["context"] for r in records]:
            raise SystemExit("the sandbox world's streams differ from the committed walks")
        records, stream = records[:per_seed], stream[:per_seed]
        data.append(choices_of(records, stream, tok, grammar, n, cfg.scol.prompt_chars))
    train, held = data[0] + data[1], data[2]
    with torch.no_grad():
        prior = torch.stack([candidate_logprobs(base, c.prompt_ids, c.completions, grammar)
                             for c in held]).mean(0)
    rows = []
    for tau in args.taus:
        run_cfg = replace(cfg, policy_steps=args.steps, policy_batch_contexts=4,
                          policy_eval_every=max(1, args.steps // 4),
                          scol=replace(cfg.scol, max_layers=1, ipo_tau=tau, ipo_lr=args.lr))
        policy = copy.deepcopy(base)
        for p in policy.parameters():
            p.requires_grad_(True)
        torch.manual_seed(0)
        started = time.time()
        curve = train_ipo(policy, base, tok, train, held, grammar, run_cfg, 0, progress=False)
        with torch.no_grad():
            after = torch.stack([candidate_logprobs(policy, c.prompt_ids, c.completions,
                                                    grammar) for c in held]).mean(0)
        rows.append({"tau": tau, "target_nats": 1 / (2 * tau), "curve": curve,
                     "mean_logp_per_layer": [round(x, 2) for x in after.tolist()],
                     "seconds": round(time.time() - started, 1)})
        print(f"tau {tau}: held-out pair accuracy "
              f"{curve[0]['held_out_pair_accuracy']:.3f} -> {curve[-1]['held_out_pair_accuracy']:.3f}, "
              f"greedy picks {curve[-1]['held_out_choices']}", flush=True)
    report = {"steps": args.steps, "lr": args.lr, "train": "seeds 0-1 (seed A pairs)",
              "held_out": "seed 2 (seed B pairs)",
              "untrained_mean_logp_per_layer": [round(x, 2) for x in prior.tolist()],
              "rows": rows}
    out.mkdir(exist_ok=True)
    (out / "scol_ipo_tau.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"IPO on the committed oracle walks ({args.steps} steps, lr {args.lr}; train "
             "seeds 0-1, held out seed 2). Untrained mean log-prob per layer (0..7): "
             f"{report['untrained_mean_logp_per_layer']}.", "",
             "| tau | target 1/(2 tau) | held-out pair accuracy, step 0 -> last | greedy "
             f"picks on the {len(held)} held-out contexts | mean log-prob per layer after |",
             "|---|---|---|---|---|"]
    for r in rows:
        picks = [",".join(map(str, x)) for x in r["curve"][-1]["held_out_choices"]]
        lines.append(f"| {r['tau']} | {r['target_nats']:.0f} nats | "
                     f"{100 * r['curve'][0]['held_out_pair_accuracy']:.1f}% -> "
                     f"{100 * r['curve'][-1]['held_out_pair_accuracy']:.1f}% | "
                     f"{' '.join(picks)} | {r['mean_logp_per_layer']} |")
    (out / "scol_ipo_tau.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
