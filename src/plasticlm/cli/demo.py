"""``plasticlm demo``: the main job, a short real pipeline end to end."""

from __future__ import annotations

import argparse
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job (a few minutes on 2 CPU cores)",
                       description="Run the project's main job end to end and print results.")
    p.add_argument("--quick", action="store_true", help="smallest sizes, for smoke tests")
    p.add_argument("--out", default="runs/demo", help="run folder")
    p.set_defaults(func=run_demo)


STORY_TEMPLATES = [
    "{a} has a {c} {t}. {a} gives the {t} to {b}.",
    "{b} likes the {c} {t} that {a} made.",
    "One day {a} and {b} found a {c} {t} in the park.",
]


def _toy_corpus(n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    names = ["Lily", "Tom", "Mia", "Ben", "Zoe", "Sam"]
    colors = ["red", "blue", "green", "small", "big"]
    things = ["ball", "kite", "cake", "boat", "hat"]
    return [rng.choice(STORY_TEMPLATES).format(a=rng.choice(names), b=rng.choice(names),
                                                c=rng.choice(colors), t=rng.choice(things))
            for _ in range(n)]


def run_demo(args) -> int:
    import torch

    from plasticlm.models import (
        build_tiny,
        evaluate_loss,
        import_llama2c,
        load_causal_lm,
        pack_corpus,
        train_bpe_tokenizer,
        train_lm,
        unigram_loss,
    )
    from plasticlm.runs import RunDir, cache_home, seed_everything, shared_data_dir

    seed_everything(0)
    run = RunDir.create("", {"quick": args.quick}, root=args.out)
    data = shared_data_dir()

    print("== 1. A real pre-trained Llama (llama2.c stories260K) through the HF path ==")
    if data and (data / "models/stories260K/stories260K.bin").exists():
        src = data / "models/stories260K"
        folder = import_llama2c(src / "stories260K.bin", src / "tok512.bin",
                                cache_home() / "models" / "stories260K")
        model, tok = load_causal_lm(folder)
        out = model.generate(torch.tensor([[tok.bos_token_id]]), max_new_tokens=40,
                             do_sample=False, pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0], skip_special_tokens=True)
        print(f"greedy from BOS: {text!r}")
        run.log(stage="stories260K", greedy=text)
    else:
        print("skipped: ../shared/data is absent (set PLASTICLM_DATA to the real-data folder)")

    print("== 2. Train a tokenizer and a tiny Qwen3 from scratch, on 2 CPU cores ==")
    docs = _toy_corpus(400 if args.quick else 3000, seed=0)
    tok = train_bpe_tokenizer(docs, vocab_size=256)
    blocks = pack_corpus(tok, docs, seq_len=64)
    n_val = max(2, len(blocks) // 10)
    train, val = blocks[n_val:], blocks[:n_val]
    model = build_tiny("qwen3", vocab_size=len(tok), hidden_size=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, max_position_embeddings=128)
    before = evaluate_loss(model, val)
    t0 = time.time()
    train_lm(model, train, steps=40 if args.quick else 300, batch_size=16, lr=3e-3, warmup=20)
    after = evaluate_loss(model, val)
    uni = unigram_loss(train, val, len(tok))
    print(f"validation loss: {before:.3f} at init -> {after:.3f} after {time.time() - t0:.0f}s "
          f"(unigram baseline {uni:.3f} nats/token)")
    prompt = tok("One day Lily and", add_special_tokens=False).input_ids
    out = model.generate(torch.tensor([[tok.bos_token_id, *prompt]]), max_new_tokens=12,
                         do_sample=False, pad_token_id=tok.pad_token_id)
    print("sample:", tok.decode(out[0], skip_special_tokens=True))
    run.log(stage="tiny-qwen3", val_loss_init=before, val_loss=after, unigram=uni)
    print(f"run folder: {run.path}")
    return 0
