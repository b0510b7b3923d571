"""Fixed blocks vs blocks packed afresh with reshuffled statements, for the sandbox receiver,
in one run.

The preset pre-trains the receiver on random blocks of one fixed packing of the world corpus
(about 79K tokens, seen 12 times in 480 steps). The other arm packs every step's batch afresh
(documents drawn from ``(seed, step)``) and shuffles the statements of each biography
(:func:`plasticlm.sandbox.shuffle_statements`), at the same steps, batch, rate and model.
Both then get the preset's needle drills. Each is probed on the held-out world MC questions
(the val + test questions of core entities, whose Q/A form never appeared in training; chance
25%) before and after the drills, and on needle choice after them; per seed, and over seeds
(mean and t-interval; the paired difference pooled over seeds, resampling entities).

    python bench/receiver_packing.py [--seeds 0 1 2] [--steps 480] [--drill-steps 200]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
RESULTS = Path(__file__).resolve().parent / "results"
ARMS = ("fixed blocks (preset)", "repacked, statements shuffled")


def main() -> None:
    from plasticlm.data.niah import haystack_sentences
    from plasticlm.eval import format_ci, pooled_bootstrap_ci, seed_ci
    from plasticlm.models import pack_corpus, train_bpe_tokenizer, train_lm, train_lm_repacked
    from plasticlm.runs import machine, seed_everything
    from plasticlm.sandbox import (
        PRESETS,
        evaluate_niah,
        shuffle_statements,
        train_drills,
        world_mc_items,
    )
    from plasticlm.sandbox.pretrain import build_model
    from plasticlm.sandbox.world import generate_world
    from plasticlm.sandbox.world_index import write_world

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=None, help="pre-training steps (preset's)")
    ap.add_argument("--drill-steps", type=int, default=None, help="drill steps (preset's)")
    ap.add_argument("--out", default=str(RESULTS / "receiver_packing.json"))
    args = ap.parse_args()

    p = PRESETS["sandbox"]
    spec = next(m for m in p.models if m.name == "receiver")
    steps = args.steps or spec.steps
    drill_steps = spec.drill_steps if args.drill_steps is None else args.drill_steps
    tspec = next(t for t in p.tokenizers if t.name == spec.tokenizer)
    world = generate_world(p.world)
    world_dir = write_world(world, Path("runs") / "receiver_packing_world")
    tok = train_bpe_tokenizer(world.train_docs, vocab_size=tspec.vocab_size)
    blocks = pack_corpus(tok, world.train_docs, p.seq_len)
    drill_hay = haystack_sentences(world.train_docs)
    eval_hay = haystack_sentences(world.valid_docs)
    warmup = min(50, steps // 5 + 1)

    def pretrain(arm: str, seed: int):
        seed_everything(seed)
        model = build_model(replace(spec, seed=seed), len(tok), max(2048, 4 * p.seq_len))
        common = dict(steps=steps, batch_size=spec.batch_size, lr=spec.lr, warmup=warmup,
                      seed=seed, desc=f"{arm}, seed {seed}")
        if arm == ARMS[0]:
            train_lm(model, blocks, **common)
        else:
            train_lm_repacked(model, tok, world.train_docs, seq_len=p.seq_len,
                              augment=shuffle_statements, **common)
        return model

    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for seed in args.seeds:
        for arm in ARMS:
            t = time.time()
            model = pretrain(arm, seed)
            row = {"seed": seed, "pretrain_seconds": round(time.time() - t, 1),
                   "before_drills": world_mc_items(model, tok, world_dir)}
            t = time.time()
            if drill_steps:
                train_drills(model, tok, drill_hay, drill_steps, p.drill_lengths,
                             p.drill_batch_size, p.drill_lr, seed=seed)
            row["drill_seconds"] = round(time.time() - t, 1)
            row["after_drills"] = world_mc_items(model, tok, world_dir)
            row["niah"] = evaluate_niah(model, tok, eval_hay, p.niah, p.niah_samples)
            runs[arm].append(row)
            print(f"seed {seed} {arm}: held-out MC "
                  f"{100 * _acc(row['before_drills']):.1f}% before drills, "
                  f"{100 * _acc(row['after_drills']):.1f}% after; needle choice "
                  + ", ".join(f"{100 * v['choice']['accuracy']:.1f}"
                              for v in row["niah"].values()), flush=True)

    def over_seeds(arm: str, stage: str) -> str:
        return format_ci(seed_ci([_acc(r[stage]) for r in runs[arm]]))

    def paired(stage: str) -> str:
        new, old = runs[ARMS[1]], runs[ARMS[0]]
        ci = pooled_bootstrap_ci(
            [[it["correct"] for it in r[stage]] for r in new],
            [[it["correct"] for it in r[stage]] for r in old],
            groups_per_seed=[[(r["seed"], it["entity"]) for it in r[stage]] for r in new])
        return format_ci(ci)

    probes = list(runs[ARMS[0]][0]["niah"])
    lines = [f"Receiver ({spec.num_layers} x {spec.hidden_size} {spec.arch}, {steps} steps of "
             f"{spec.batch_size} x {p.seq_len} tokens, then {drill_steps} drill steps), seeds "
             f"{args.seeds}; mean over seeds [95% t-interval], n = "
             f"{len(runs[ARMS[0]][0]['after_drills'])} questions per seed:", "",
             "| pre-training batches | held-out MC before drills | after drills | needle "
             "choice " + " / ".join(probes) + " | pre-train s | drill s |",
             "|---|---|---|---|---|---|"]
    for arm in ARMS:
        needles = " / ".join(format_ci(seed_ci([r["niah"][k]["choice"]["accuracy"]
                                                for r in runs[arm]])) for k in probes)
        secs = [sum(r[k] for r in runs[arm]) / len(runs[arm])
                for k in ("pretrain_seconds", "drill_seconds")]
        lines.append(f"| {arm} | {over_seeds(arm, 'before_drills')} | "
                     f"{over_seeds(arm, 'after_drills')} | {needles} | {secs[0]:.0f} | "
                     f"{secs[1]:.0f} |")
    lines += ["", "Repacked minus fixed, paired over the same questions, pooled over seeds "
              f"(entities resampled): before drills {paired('before_drills')} pp, after "
              f"drills {paired('after_drills')} pp."]
    table = "\n".join(lines)
    print("\n" + table)
    result = {"steps": steps, "drill_steps": drill_steps, "seeds": args.seeds,
              "machine": machine(), "torch_threads": torch.get_num_threads(),
              "runs": {arm: [_columns(r) for r in rows] for arm, rows in runs.items()},
              "table": table}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(table + "\n")


def _columns(row: dict) -> dict:
    """A run's record with each question list stored as columns (correct, entity)."""
    return {k: ({"correct": [it["correct"] for it in v], "entity": [it["entity"] for it in v]}
                if k in ("before_drills", "after_drills") else v) for k, v in row.items()}


def _acc(items: list[dict]) -> float:
    return sum(it["correct"] for it in items) / len(items)


if __name__ == "__main__":
    main()
