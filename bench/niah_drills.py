"""What fresh NIAH drills do to the sandbox receiver, in one run: pre-train the preset's
receiver (its spec, seed and corpus, no drills), then fine-tune copies on never-repeated
single-needle drills with (a) the answer's loss only and (b) the answer's plus the
haystack's loss (the preset's choice: the haystack is the world's sentences, so it replays
the corpus). Each model is scored on NIAH (greedy generation, RULER's exact score, and
4-way choice, chance 25%) on the validation filler, and on held-out world MC questions.

    python bench/niah_drills.py [--steps 400] [--eval-samples 40]
    python bench/niah_drills.py --smoke   # the quick preset, 2 drill steps; a temp folder
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

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    from plasticlm.data.niah import haystack_sentences
    from plasticlm.models import pack_corpus, train_bpe_tokenizer, train_lm
    from plasticlm.sandbox import PRESETS, evaluate_niah, evaluate_world_mc, train_drills
    from plasticlm.sandbox.pretrain import build_model
    from plasticlm.sandbox.world import generate_world
    from plasticlm.sandbox.world_index import write_world

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=400, help="drill steps")
    ap.add_argument("--eval-samples", type=int, default=40)
    ap.add_argument("--out", default=str(RESULTS / "niah_drills.json"))
    ap.add_argument("--smoke", action="store_true", help="the quick preset's receiver and "
                    "probes, 2 drill steps, 2 samples per probe, written to a temp folder")
    args = ap.parse_args()
    runs = Path("runs")
    if args.smoke:
        args.steps, args.eval_samples = 2, 2
        runs = Path(tempfile.mkdtemp(prefix="bench-smoke-"))
        args.out = str(runs / "niah_drills.json")

    p = PRESETS["quick" if args.smoke else "sandbox"]
    spec = next(m for m in p.models if m.name == "receiver")
    tspec = next(t for t in p.tokenizers if t.name == spec.tokenizer)
    world = generate_world(p.world)
    world_dir = write_world(world, runs / "niah_drills_world")
    tok = train_bpe_tokenizer(world.train_docs, vocab_size=tspec.vocab_size)
    torch.manual_seed(spec.seed)
    t0 = time.time()
    base = build_model(replace(spec, drill_steps=0), len(tok), max(2048, 4 * p.seq_len))
    train_lm(base, pack_corpus(tok, world.train_docs, p.seq_len), spec.steps,
             batch_size=spec.batch_size, lr=spec.lr, warmup=min(50, spec.steps // 5 + 1),
             seed=spec.seed, desc="pre-train receiver")
    pretrain_seconds = time.time() - t0
    drill_hay = haystack_sentences(world.train_docs)
    eval_hay = haystack_sentences(world.valid_docs)
    # the quick preset's tokenizer is short: its own probes (single-needle at 160 tokens)
    probes = p.niah if args.smoke else (("single", 128), ("single", 224), ("multikey", 224))

    def drills(replay: bool):
        return lambda m: train_drills(m, tok, drill_hay, args.steps, p.drill_lengths,
                                      p.drill_batch_size, p.drill_lr, seed=spec.seed,
                                      replay=replay)

    variants = {"no drills": None, "drills, answer loss only": drills(False),
                "drills, answer + haystack loss (preset)": drills(True)}
    rows = {}
    for name, drill in variants.items():
        model = copy.deepcopy(base)
        t = time.time()
        losses = drill(model) if drill else []
        rows[name] = {"drill_seconds": round(time.time() - t, 1),
                      "drill_loss_every_50": [round(x, 4) for x in losses[::50]],
                      "mc_core_heldout": evaluate_world_mc(model, tok, world_dir, "core")["all"],
                      "niah": evaluate_niah(model, tok, eval_hay, probes, args.eval_samples)}
    result = {"steps": args.steps, "batch_size": p.drill_batch_size, "lr": p.drill_lr,
              "pretrain_seconds": round(pretrain_seconds, 1),
              "torch_threads": torch.get_num_threads(), "variants": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    head = "| receiver | held-out MC | " + " | ".join(
        f"{t}/{n} gen / choice" for t, n in probes) + " |"
    print(head + "\n|" + "---|" * (2 + len(probes)))
    for name, r in rows.items():
        cells = [f"{100 * r['niah'][f'{t}/{n}']['score']['accuracy']:.1f}% / "
                 f"{100 * r['niah'][f'{t}/{n}']['choice']['accuracy']:.1f}%" for t, n in probes]
        print(f"| {name} | {100 * r['mc_core_heldout']['accuracy']:.1f}% | "
              + " | ".join(cells) + " |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
