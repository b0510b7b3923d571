"""Can the sandbox receiver learn to retrieve needles? Fine-tune a copy on *fresh* NIAH
drills (new haystacks and needles every step, training-corpus filler) and score NIAH on
the validation filler before and after, by greedy generation (RULER's exact score) and by
4-way log-likelihood choice (chance 25%).

The pre-trained receiver saw 500 fixed drills about 8 times each and memorised them
instead of learning to copy; this measures whether fresh drills teach the copy.

    python bench/niah_drills.py [--steps 400] [--out bench/results/niah_drills.json]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from plasticlm.data.corpus import load_text_corpus
from plasticlm.data.niah import generate_niah, haystack_sentences
from plasticlm.data.sandbox import evaluate_niah, sandbox_model, sandbox_world
from plasticlm.eval import encode_pair
from plasticlm.models import load_causal_lm


def drill_batch(tokenizer, hay, batch: int, length: int, seed: int):
    """(input_ids, labels) of fresh single-needle samples; loss only on the answer."""
    pairs = [encode_pair(tokenizer, s.prompt, s.target)
             for s in generate_niah("single", batch, length, hay, seed=seed)]
    width = max(len(c) + len(a) for c, a in pairs)
    ids = torch.zeros(batch, width, dtype=torch.long)
    labels = torch.full((batch, width), -100)
    for i, (c, a) in enumerate(pairs):
        ids[i, : len(c) + len(a)] = torch.tensor(c + a)
        labels[i, len(c) : len(c) + len(a)] = torch.tensor(a)
    return ids, labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-samples", type=int, default=40)
    ap.add_argument("--out", default="bench/results/niah_drills.json")
    args = ap.parse_args()

    torch.manual_seed(0)
    model, tok = load_causal_lm(sandbox_model("receiver"))
    world = sandbox_world()
    train_hay = haystack_sentences(load_text_corpus(world / "corpus" / "train.txt"))
    eval_hay = haystack_sentences(load_text_corpus(world / "corpus" / "valid.txt"))
    probes = [("single", 128), ("single", 224), ("multikey", 224)]
    before = evaluate_niah(model, tok, eval_hay, probes, args.eval_samples)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rng = random.Random(0)
    losses, t0 = [], time.time()
    model.train()
    for step in range(args.steps):
        ids, labels = drill_batch(tok, train_hay, args.batch, rng.choice([64, 96, 128]),
                                  seed=10_000 + step)
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                               ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 4))
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    train_seconds = time.time() - t0
    after = evaluate_niah(model, tok, eval_hay, probes, args.eval_samples)
    result = {"steps": args.steps, "batch": args.batch, "lr": args.lr,
              "train_seconds": round(train_seconds, 1), "loss_every_50": losses[::50],
              "before": before, "after": after}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for key in before:
        print(f"{key}: generation {before[key]['score']:.3f} -> {after[key]['score']:.3f}, "
              f"choice {before[key]['choice']:.3f} -> {after[key]['choice']:.3f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
