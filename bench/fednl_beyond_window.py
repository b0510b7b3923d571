"""Where test-time memory matters: questions whose evidence lies beyond the attention window.

    python bench/fednl_beyond_window.py --task openbook|niah [--preset sandbox] [--window 16]
        [--steps 80] [--seeds 3]
    python bench/fednl_beyond_window.py --smoke   # the quick sandbox, 2 steps, 4 test items

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
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("window, untrained", "window + LoRA", "memory (FedNL theta)",
            "memory, recurrence removed", "full attention + LoRA")
MEMORY = dict(layers="all", rank=8, conv_size=4, gate_init=0.0)
# one change of the memory (FedNL theta) at a time; "beta fixed" freezes beta at 0.5
ABLATION = {
    "memory (FedNL theta)": {},
    "LoRA shared with attention": dict(lora_scope="shared"),
    "gate starts at -3": dict(gate_init=-3.0),
    "input-dependent gate": dict(gate="input"),
    "beta fixed at 0.5": {},
    "no short convolution": dict(conv_size=0),
    "decay (gated delta rule)": dict(decay=True),
    "additive mix (attn + alpha * mem)": dict(mix="additive"),
    "additive mix, normalised memory read": dict(mix="additive", memory_norm=True),
    "memory, recurrence removed": dict(recurrent=False),
}


@dataclass(frozen=True)
class ChoiceItem:
    prompt: str
    choices: tuple[str, ...]
    answer: int
    entity: str


def niah_items(world, tok, length: int, n: int, seed: int) -> list[ChoiceItem]:
    """Single-needle samples of ``length`` tokens with the needle in the first half (far
    beyond a short window), as 4-way choices: the needle's number against three numbers
    of the same format."""
    from plasticlm.data.niah import generate_niah, haystack_sentences
    from plasticlm.sandbox.probes import same_format_decoy

    rng = random.Random(seed)
    samples = generate_niah("single", n, length, haystack_sentences(world.valid_docs),
                            seed=seed, tokenizer=tok, depths=(0.0, 0.2, 0.4))
    items = []
    for s in samples:
        options = [s.answers[0]]
        while len(options) < 4:
            fake = same_format_decoy(s.answers[0], rng)
            if fake not in options:
                options.append(fake)
        rng.shuffle(options)
        items.append(ChoiceItem(s.prompt, tuple(options), options.index(s.answers[0]), s.id))
    return items


def build(variant: str, folder: Path, window: int, seed: int):
    import torch
    from peft import LoraConfig, get_peft_model

    from plasticlm.memory import attach_memory
    from plasticlm.models import load_causal_lm

    torch.manual_seed(seed)
    model, tok = load_causal_lm(folder)
    if variant in ABLATION:
        attach_memory(model, window=window, **{**MEMORY, **ABLATION[variant]})
        if variant == "beta fixed at 0.5":
            for layer in model.get_decoder().layers:
                layer.self_attn.beta_proj.weight.data.zero_()
                layer.self_attn.beta_proj.requires_grad_(False)
        return model, tok
    if variant.startswith("window"):
        attach_memory(model, layers=[], window=window)
    if variant.endswith("LoRA"):
        lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, bias="none",
                          target_modules=["q_proj", "k_proj", "v_proj"])
        model = get_peft_model(model, lora)
    return model, tok


def train(model, tok, items, steps: int, batch: int, seed: int) -> list[float]:
    import torch

    from plasticlm.eval import encode_pair, qa_continuation
    from plasticlm.fednl.objective import answer_loss, param_groups
    from plasticlm.fednl.sections import TrainConfig

    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(param_groups(params, TrainConfig().gate_lr), lr=TrainConfig().lr,
                            weight_decay=0.0)
    pairs = [encode_pair(tok, it.prompt, qa_continuation(it.choices[it.answer])) for it in items]
    rng, losses = random.Random(seed), []
    model.train()
    for _ in range(steps):
        chosen = [pairs[rng.randrange(len(pairs))] for _ in range(batch)]
        width = max(len(c) + len(a) for c, a in chosen)
        ids = torch.full((batch, width), tok.pad_token_id or 0)
        labels = torch.full((batch, width), -100)
        for i, (c, a) in enumerate(chosen):
            ids[i, : len(c) + len(a)] = torch.tensor(c + a)
            labels[i, len(c): len(c) + len(a)] = torch.tensor(a)
        loss = answer_loss(model, ids, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def main(argv=None) -> int:
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
                    "2 steps of 2, 4 test items, written to a temp folder (a quick check)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.preset, args.steps, args.batch, args.seeds, args.max_test = "quick", 2, 2, 1, 4
        args.out = str(Path(tempfile.mkdtemp(prefix="bench-smoke-"))
                       / f"fednl_beyond_window_{args.task}.json")
    suffix = "_ablation" if args.ablation else ""
    args.out = args.out or str(RESULTS / f"fednl_beyond_window_{args.task}{suffix}.json")
    variants = ("window + LoRA", *ABLATION) if args.ablation else VARIANTS
    if args.only:
        wanted = {x.strip() for x in args.only.split(";")}
        unknown = wanted - set(ABLATION)
        if unknown or not args.ablation:
            ap.error(f"--only needs --ablation and rows of {sorted(ABLATION)}; got {sorted(unknown)}")
        variants = ("window + LoRA", *[v for v in ABLATION if v in wanted])

    from plasticlm.eval import (
        closed_set_accuracy,
        format_ci,
        format_paired,
        paired_intervals,
        pooled_bootstrap_ci,
    )
    from plasticlm.models import load_causal_lm
    from plasticlm.runtime import set_threads
    from plasticlm.sandbox import get_preset, sandbox_model
    from plasticlm.sandbox.tasks import openbook_items
    from plasticlm.sandbox.world import generate_world

    set_threads(args.threads)
    folder = sandbox_model("receiver", preset=args.preset)
    world = generate_world(get_preset(args.preset).world)
    lo, hi = (int(x) for x in args.filler.split(","))
    if args.task == "openbook":
        items = openbook_items(world, filler_words=(lo, hi), seed=0)
        entities = sorted({it.entity for it in items})
        held_out = set(entities[1::2])
        train_items = [it for it in items if it.entity not in held_out]
        test_items = [it for it in items if it.entity in held_out][: args.max_test]
    else:
        _, tok = load_causal_lm(folder)
        train_items = niah_items(world, tok, args.niah_length, 400, seed=1)
        test_items = niah_items(world, tok, args.niah_length, args.max_test, seed=2)
    groups = [it.entity for it in test_items]
    scores: dict[str, list[list[float]]] = {v: [] for v in variants}
    meta: dict[str, dict] = {v: {"seconds": [], "final_loss": []} for v in variants}
    for seed in range(args.seeds):
        for variant in variants:
            t = time.time()
            model, tok = build(variant, folder, args.window, seed)
            losses = [] if variant == "window, untrained" else \
                train(model, tok, train_items, args.steps, args.batch, seed)
            result = closed_set_accuracy(model, tok, [it.prompt for it in test_items],
                                         [list(it.choices) for it in test_items],
                                         [it.answer for it in test_items], batch_size=16)
            scores[variant].append(list(result.correct))
            meta[variant]["seconds"].append(round(time.time() - t, 1))
            meta[variant]["final_loss"].append(round(sum(losses[-10:]) / 10, 4) if losses else None)
            print(f"seed {seed} {variant}: {100 * result.accuracy:.1f}% "
                  f"({time.time() - t:.0f} s)", file=sys.stderr, flush=True)
    window_lora = scores["window + LoRA"]
    cis = {v: (pooled_bootstrap_ci(scores[v], groups_per_seed=[groups] * args.seeds),
               *paired_intervals(scores[v], window_lora, [groups] * args.seeds))
           for v in variants}
    table = {v: {"accuracy": ci.mean, "low": ci.low, "high": ci.high,
                 "minus_window_lora": d.mean, "diff_low": d.low, "diff_high": d.high,
                 "diff_seeds_low": s.low, "diff_seeds_high": s.high,
                 "correct_per_seed": scores[v], **meta[v]}
             for v, (ci, d, s) in cis.items()}
    report = {"task": args.task, "ablation": args.ablation, "preset": args.preset,
              "window": args.window, "steps": args.steps,
              "batch": args.batch, "seeds": args.seeds, "filler_words": [lo, hi],
              "train_items": len(train_items), "test_items": len(test_items),
              "test_entities": len(set(groups)), "table": table}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"| {args.task}: variant (W={args.window}, frozen receiver, {args.seeds} seeds, "
          f"n={len(test_items)} test items) | 4-way accuracy [95% CI] | minus window + LoRA "
          "[paired 95% CI] (seeds) |")
    print("|---|---|---|")
    for v, (ci, d, s) in cis.items():
        print(f"| {v} | {format_ci(ci)} | {format_paired(d, s)} |")
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
