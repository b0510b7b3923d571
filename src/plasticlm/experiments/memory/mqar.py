"""MQAR (multi-query associative recall, zoology protocol): the recall probe for memories.

Keys come from [1, V/2), values from [V/2, V), unique within an example. The sequence opens
with the pairs k1 v1 k2 v2 ...; afterwards each key appears once more at a random place,
followed by its value; everything else is token 0. Only a re-queried key position carries a
label (its value: the next token); accuracy = argmax == label over labelled positions.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

from plasticlm.errors import PlasticError
from plasticlm.experiments.memory.mqar_config import MQARConfig, check_mqar_sizes
from plasticlm.memory.adapter import attach_memory
from plasticlm.models import build_tiny
from plasticlm.runtime import seed_everything, set_threads

IGNORE = -100


def mqar_batch(batch: int, seq_len: int, num_kv: int, vocab_size: int,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [B,T], labels [B,T]) with labels = IGNORE except at re-queried keys."""
    check_mqar_sizes(vocab_size, seq_len, num_kv)
    half, slots = vocab_size // 2, (seq_len - 2 * num_kv) // 2
    gen = generator
    keys = torch.stack([torch.randperm(half - 1, generator=gen)[:num_kv] + 1 for _ in range(batch)])
    values = torch.stack([torch.randperm(vocab_size - half, generator=gen)[:num_kv] + half
                          for _ in range(batch)])
    ids = torch.zeros(batch, seq_len, dtype=torch.long)
    labels = torch.full((batch, seq_len), IGNORE, dtype=torch.long)
    ids[:, 0:2 * num_kv:2] = keys
    ids[:, 1:2 * num_kv:2] = values
    for b in range(batch):
        # query slots are even offsets after the context, so a key and its value never overlap
        slot = torch.randperm(slots, generator=gen)[:num_kv] * 2 + 2 * num_kv
        order = torch.randperm(num_kv, generator=gen)
        ids[b, slot] = keys[b, order]
        ids[b, slot + 1] = values[b, order]
        labels[b, slot] = values[b, order]
    return ids, labels


def mqar_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of labelled positions where argmax(logits [B,T,V]) == labels [B,T]."""
    mask = labels != IGNORE
    if not mask.any():
        raise PlasticError("no labelled positions in this batch")
    return (logits.argmax(-1)[mask] == labels[mask]).float().mean().item()


def build_mqar_model(config: MQARConfig, with_memory: bool):
    """The tiny Llama, windowed everywhere; with a memory in both layers when ``with_memory``.
    Every parameter is trainable (the model learns from scratch)."""
    model = build_tiny("llama", seed=config.seed, vocab_size=config.vocab, hidden_size=config.hidden,
                       num_layers=2, num_heads=config.heads, max_position_embeddings=4096)
    attach_memory(model, layers="all" if with_memory else [], window=config.window, rank=config.rank,
                  conv_size=config.conv, gate_init=0.0, chunk_size=64,
                  recurrent=config.recurrent)
    for p in model.parameters():
        p.requires_grad_(True)
    return model.train()


@torch.no_grad()
def evaluate_mqar(model, seq_len: int, num_kv: int, vocab: int, examples: int, seed: int) -> float:
    """Mean MQAR accuracy over ``examples`` fresh examples (batches of 64)."""
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    accs = []
    for _ in range(max(examples // 64, 1)):
        ids, labels = mqar_batch(64, seq_len, num_kv, vocab, gen)
        accs.append(mqar_accuracy(model(ids, use_cache=False).logits, labels))
    model.train(was_training)
    return sum(accs) / len(accs)


def train_mqar(config: MQARConfig, with_memory: bool, progress: bool = True) -> dict:
    """Train one variant; returns its curve (step, loss, acc), test accuracies and timing."""
    seed_everything(config.seed)
    model = build_mqar_model(config, with_memory)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=config.steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(config.seed)
    curve, losses = [], []
    start = time.perf_counter()
    name = "memory" if with_memory else "window"
    for step in tqdm(range(1, config.steps + 1), desc=name, disable=not progress):
        ids, labels = mqar_batch(config.batch, config.seq_len, config.num_kv, config.vocab, gen)
        logits = model(ids, use_cache=False).logits
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % config.eval_every == 0 or step == config.steps:
            acc = evaluate_mqar(model, config.seq_len, config.num_kv, config.vocab, 256, seed=10_000)
            curve.append({"step": step, "loss": round(loss.item(), 4), "acc": round(acc, 4),
                          "seconds": round(time.perf_counter() - start, 1)})
    train_s = time.perf_counter() - start
    tests = {f"seq{s}_kv{k}": round(evaluate_mqar(model, s, k, config.vocab, config.test_examples, seed=20_000), 4)
             for s, k in config.test_settings()}
    window = max(len(losses) // 3, 1)
    return {"train_seconds": round(train_s, 1), "parameters": sum(p.numel() for p in model.parameters()),
            "loss_first_third": round(sum(losses[:window]) / window, 4),
            "loss_last_third": round(sum(losses[-window:]) / window, 4),
            "curve": curve, "test_accuracy": tests}


def run_mqar(config: MQARConfig, progress: bool = True) -> dict:
    """Both variants with the same budget: window alone, then window + memory."""
    set_threads(config.threads)
    return {
        "setup": dataclasses.asdict(config),
        "what": "2-layer tiny llama trained from scratch, all parameters trainable in both variants; "
                "memory variant = attach_memory(layers=all, conv, gate_init=0); "
                "window variant = attach_memory(layers=[]) (windowed softmax only)",
        "window_only": train_mqar(config, with_memory=False, progress=progress),
        "memory": train_mqar(config, with_memory=True, progress=progress),
    }
