"""Where test-time memory matters: questions whose evidence lies beyond the attention window.

Only theta trains, centrally (the mechanism FedNL federates), on a frozen receiver; every
variant is scored by 4-way choice by log-likelihood (chance 25%):

- window, untrained: the frozen receiver with W-token attention (the control);
- window + LoRA: FedAvg's theta (LoRA r8 on q/k/v) at the same window (equal O(1) state);
- memory (FedNL theta): delta-rule memory in every layer, gate open, conv 4, LoRA r8;
- memory, recurrence removed: the same theta, each token writes into an empty state;
- full attention + LoRA: the O(T) reference, whose KV cache grows with the context.

``niah``: single-needle samples with the needle in the first 40% (far beyond a short window);
``openbook``: the world's open-book items, train on half the unseen entities, test on the
other half. :func:`run_beyond_window` runs seeds x variants; :func:`beyond_window_table`
renders its report. ``bench/fednl_beyond_window.py`` and ``plasticlm demo`` call them.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

from plasticlm.eval.prompts import context_prompt

log = logging.getLogger("plasticlm.fednl")

VARIANTS = ("window, untrained", "window + LoRA", "memory (FedNL theta)",
            "memory, recurrence removed", "full attention + LoRA")
BASELINE = "window + LoRA"   # every difference is against the equal-state baseline
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
    """A prompt, its choices (one right: ``choices[answer]``) and the entity it is about
    (the bootstrap's cluster)."""

    prompt: str
    choices: tuple[str, ...]
    answer: int
    entity: str


def niah_items(world, tok, length: int, n: int, seed: int) -> list[ChoiceItem]:
    """``n`` single-needle samples of ``length`` tokens, the needle at depth 0, 0.2 or 0.4
    (far beyond a short window), as 4-way choices: the needle's number against three
    distinct numbers of the same format."""
    from plasticlm.data.niah import generate_niah, haystack_sentences
    from plasticlm.eval.niah import same_format_decoy

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
    """(model, tokenizer) of ``variant``: the receiver at ``folder`` with base weights frozen
    and only the variant's theta trainable (none for "window, untrained")."""
    import torch
    from peft import LoraConfig, get_peft_model

    from plasticlm.memory import attach_memory
    from plasticlm.models import load_causal_lm

    torch.manual_seed(seed)   # theta's initialisation differs per seed
    model, tok = load_causal_lm(folder)
    if variant in ABLATION:
        attach_memory(model, window=window, **{**MEMORY, **ABLATION[variant]})
        if variant == "beta fixed at 0.5":   # zero weights: sigmoid(0) = 0.5 for every token
            for layer in model.get_decoder().layers:
                layer.self_attn.beta_proj.weight.data.zero_()
                layer.self_attn.beta_proj.requires_grad_(False)
        return model, tok
    if variant.startswith("window"):
        attach_memory(model, layers=[], window=window)   # window only, base frozen
    if variant.endswith("LoRA"):
        lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, bias="none",
                          target_modules=["q_proj", "k_proj", "v_proj"])
        model = get_peft_model(model, lora)
    return model, tok


def train(model, tok, items, steps: int, batch: int, seed: int) -> list[float]:
    """``steps`` AdamW steps of ``batch`` items drawn with replacement, loss on the right
    answer's tokens only; updates the parameters that require grad. Returns the losses."""
    import torch

    from plasticlm.eval import encode_pair, qa_continuation
    from plasticlm.fednl.config_sections import TrainConfig
    from plasticlm.fednl.objective import answer_loss, param_groups

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
        labels = torch.full((batch, width), -100)   # [batch, width]; -100: not scored
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


def task_items(folder: Path, world, task: str, max_test: int, niah_length: int = 96,
               filler: tuple[int, int] = (40, 80)) -> tuple[list, list]:
    """(train items, test items) of ``task``; niah: 400 fresh needles to train on and
    ``max_test`` others to test; openbook: half the unseen entities each."""
    if task == "openbook":
        from plasticlm.sandbox.tasks import openbook_items

        items = [ChoiceItem(context_prompt(it.context, it.question), it.choices, it.answer,
                            it.entity)
                 for it in openbook_items(world, filler_words=tuple(filler), seed=0)]
        held_out = set(sorted({it.entity for it in items})[1::2])
        return ([it for it in items if it.entity not in held_out],
                [it for it in items if it.entity in held_out][:max_test])
    if task != "niah":
        raise ValueError(f"task is 'niah' or 'openbook', not {task!r}")
    from plasticlm.models import load_causal_lm

    _, tok = load_causal_lm(folder)
    return (niah_items(world, tok, niah_length, 400, seed=1),
            niah_items(world, tok, niah_length, max_test, seed=2))


def run_beyond_window(folder: Path, world, task: str = "niah", variants=VARIANTS,
                      window: int = 16, steps: int = 80, batch: int = 8, seeds: int = 3,
                      max_test: int = 400, niah_length: int = 96,
                      filler: tuple[int, int] = (40, 80), progress: bool = True) -> dict:
    """Every seed x variant trained (all but "window, untrained") and scored on the same test
    items; returns the report: sizes and ``table[variant]`` with the accuracy's interval
    pooled over seeds and its paired difference from "window + LoRA" (item and seeds
    intervals), ``correct_per_seed`` [seeds][items], ``seconds`` and ``final_loss`` per seed."""
    from plasticlm.eval import closed_set_accuracy, paired_intervals, pooled_bootstrap_ci

    if BASELINE not in variants:
        raise ValueError(f"variants must include {BASELINE!r}, the reference of every difference")
    train_items, test_items = task_items(folder, world, task, max_test, niah_length, filler)
    groups = [it.entity for it in test_items]
    scores: dict[str, list[list[float]]] = {v: [] for v in variants}
    meta: dict[str, dict] = {v: {"seconds": [], "final_loss": []} for v in variants}
    for seed in range(seeds):
        for variant in variants:
            t = time.time()
            model, tok = build(variant, folder, window, seed)
            losses = [] if variant == "window, untrained" else \
                train(model, tok, train_items, steps, batch, seed)
            result = closed_set_accuracy(model, tok, [it.prompt for it in test_items],
                                         [list(it.choices) for it in test_items],
                                         [it.answer for it in test_items], batch_size=16)
            scores[variant].append(list(result.correct))
            meta[variant]["seconds"].append(round(time.time() - t, 1))
            tail = losses[-10:]
            meta[variant]["final_loss"].append(round(sum(tail) / len(tail), 4) if tail else None)
            if progress:
                log.info("beyond the window (%s), seed %d, %s: %.1f%% (%.0f s)", task, seed,
                         variant, 100 * result.accuracy, time.time() - t)
    table = {}
    for v in variants:
        # entity-clustered bootstrap pooled over seeds; differences paired on the same items
        ci = pooled_bootstrap_ci(scores[v], groups_per_seed=[groups] * seeds)
        d, s = paired_intervals(scores[v], scores[BASELINE], [groups] * seeds)
        table[v] = {"accuracy": ci.mean, "low": ci.low, "high": ci.high,
                    "minus_window_lora": d.mean, "diff_low": d.low, "diff_high": d.high,
                    "diff_seeds_low": s.low, "diff_seeds_high": s.high,
                    "correct_per_seed": scores[v], **meta[v]}
    return {"task": task, "window": window, "steps": steps, "batch": batch, "seeds": seeds,
            "filler_words": list(filler), "train_items": len(train_items), "test_items": len(test_items),
            "test_entities": len(set(groups)), "table": table}


def beyond_window_table(report: dict) -> str:
    """The report as a Markdown table: variant | accuracy [95% CI] | minus window + LoRA
    [paired 95% CI] (seeds interval)."""
    from plasticlm.eval import CI, format_ci, format_paired

    seeds, n = report["seeds"], report["test_items"]
    lines = [f"| {report['task']}: variant (W={report['window']}, frozen receiver, {seeds} "
             f"seed{'s' if seeds != 1 else ''}, n={n} test items) | 4-way accuracy [95% CI] "
             "| minus window + LoRA [paired 95% CI] (seeds) |", "|---|---|---|"]
    for v, row in report["table"].items():
        # rebuilt from the JSON fields; one seed has no seeds interval (rendered "n/a"), and
        # reports written before the seeds interval existed show the item interval alone
        ci = CI(row["accuracy"], row["low"], row["high"], n * seeds, 0.95)
        d = CI(row["minus_window_lora"], row["diff_low"], row["diff_high"], n * seeds, 0.95)
        diff = format_ci(d)
        if "diff_seeds_low" in row:
            diff = format_paired(d, CI(row["minus_window_lora"], row["diff_seeds_low"],
                                       row["diff_seeds_high"], seeds, 0.95,
                                       degenerate=seeds < 2))
        lines.append(f"| {v} | {format_ci(ci)} | {diff} |")
    return "\n".join(lines)
