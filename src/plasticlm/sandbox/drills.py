"""Retrieval drills: teach a pre-trained receiver to copy a needle out of its context."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from plasticlm.data.niah import generate_niah
from plasticlm.eval import encode_pair
from plasticlm.models import train_steps


def niah_drill_batch(tokenizer, sentences: list[str], batch_size: int, length: int,
                     seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, labels)``, both ``[batch_size, T]``, of fresh single-needle samples of
    about ``length`` tokens; labels are -100 except on the answer (right-padded)."""
    pairs = [encode_pair(tokenizer, s.prompt, s.target)
             for s in generate_niah("single", batch_size, length, sentences, seed=seed)]
    width = max(len(c) + len(a) for c, a in pairs)
    ids = torch.full((batch_size, width), tokenizer.pad_token_id or 0, dtype=torch.long)
    labels = torch.full((batch_size, width), -100, dtype=torch.long)
    for i, (c, a) in enumerate(pairs):
        ids[i, : len(c) + len(a)] = torch.tensor(c + a)
        labels[i, len(c): len(c) + len(a)] = torch.tensor(a)
    return ids, labels


def train_niah_drills(model, tokenizer, sentences: list[str], steps: int,
                      lengths: tuple[int, ...] = (64, 96, 128), batch_size: int = 16,
                      lr: float = 1e-3, seed: int = 0, replay: bool = True,
                      progress: bool = True, checkpoint=None, checkpoint_every: int = 50,
                      checkpoint_key: str = "") -> list[float]:
    """Fine-tune ``model`` on ``steps`` batches of never-repeated single-needle drills whose
    haystack is ``sentences``. Each step's loss is the answer's cross-entropy plus, with
    ``replay``, that of the haystack text: with the world's own sentences as haystack, the
    second term replays the corpus, so the model learns to copy without forgetting the
    world. Every draw is a function of ``(seed, step)``, so a resumed run (``checkpoint``,
    see :func:`plasticlm.models.train_steps`) repeats the uninterrupted one. Returns the
    losses."""
    pad = tokenizer.pad_token_id or 0

    def loss_at(step: int) -> torch.Tensor:
        length = random.Random(seed * 100_003 + step).choice(lengths)
        # Seeds far from the evaluation's (0..) so no drill repeats an evaluated needle.
        ids, answer = niah_drill_batch(tokenizer, sentences, batch_size, length,
                                       seed=1_000_000 + 10_007 * seed + step)
        text = ids.masked_fill((answer != -100) | (ids == pad), -100)
        logits = model(input_ids=ids).logits[:, :-1].flatten(0, 1).float()
        loss = F.cross_entropy(logits, answer[:, 1:].flatten(), ignore_index=-100)
        if replay:
            loss = loss + F.cross_entropy(logits, text[:, 1:].flatten(), ignore_index=-100)
        return loss

    return train_steps(model, loss_at, steps, lr=lr, warmup=min(20, steps // 5 + 1),
                       desc="NIAH drills", progress=progress, checkpoint=checkpoint,
                       checkpoint_every=checkpoint_every,
                       checkpoint_key=f"drills:{checkpoint_key}:{seed}:{lengths}:{batch_size}:{replay}")
