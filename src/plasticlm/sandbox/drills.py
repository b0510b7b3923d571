"""Context drills: teach a pre-trained receiver to read its context.

Three kinds. Two are never repeated (every sample is drawn fresh from ``(seed, step)``):
- needle drills: copy a number out of a haystack (NIAH single);
- reading drills: a made-up entity's passage (a name no world entity has, random values),
  filler, then a question on one of its attributes in the one QA template: the open-book
  skill, which the world corpus never teaches because its biographies and Q/A lines are
  separate documents. Values are random per sample, so only reading can answer.

The third, fact drills, teaches a fixed set of (prompt, answer) facts: how the FedRefine
experiments make transmitters that know a chosen part of the world (an oracle, disjoint
parties).
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from plasticlm.data.niah import generate_niah
from plasticlm.eval import encode_pair, qa_continuation, qa_prompt
from plasticlm.models import train_steps
from plasticlm.models.pretrain import lm_loss, pack_corpus
from plasticlm.sandbox.domains import KINDS, Entity, entity_name, person_name
from plasticlm.sandbox.passages import passage_text
from plasticlm.sandbox.tasks import filler_text
from plasticlm.sandbox.world import World


def _answer_batch(pairs: list[tuple[list[int], list[int]]], pad: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(c) + len(a) for c, a in pairs)
    ids = torch.full((len(pairs), width), pad, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    for i, (c, a) in enumerate(pairs):
        ids[i, : len(c) + len(a)] = torch.tensor(c + a)
        labels[i, len(c): len(c) + len(a)] = torch.tensor(a)
    return ids, labels


def niah_drill_batch(tokenizer, sentences: list[str], batch_size: int, length: int,
                     seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, labels)``, both ``[batch_size, T]``, of fresh single-needle samples of
    about ``length`` tokens; labels are -100 except on the answer (right-padded)."""
    pairs = [encode_pair(tokenizer, s.prompt, s.target)
             for s in generate_niah("single", batch_size, length, sentences, seed=seed)]
    return _answer_batch(pairs, tokenizer.pad_token_id or 0)


def reading_drill_batch(world: World, tokenizer, batch_size: int, filler_words: tuple[int, int],
                        seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, labels)`` ``[batch_size, T]`` of fresh reading drills: passage of a
    made-up entity, ``filler_words`` (a range) of filler, question; labels only on the
    answer. Names of world entities are never used."""
    rng = random.Random(seed)
    taken = {e.name for e in world.entities}
    pairs = []
    for _ in range(batch_size):
        d = rng.choice(world.domains)
        name = entity_name(KINDS[d.name], rng)
        while name in taken:
            name = entity_name(KINDS[d.name], rng)
        values = {a.name: rng.choice([v for v in a.values if v != name]) if a.closed
                  else person_name(rng) for a in d.attributes}
        e = Entity(f"drill.{d.name}", name, d.name, "drill", 0, 0, "", False, values)
        a = rng.choice(d.attributes)
        prompt = (f"{passage_text(e, d, rng)}\n{filler_text(rng.randint(*filler_words), rng)}\n"
                  f"{qa_prompt(a.question.format(e=name))}")
        pairs.append(encode_pair(tokenizer, prompt, qa_continuation(values[a.name])))
    return _answer_batch(pairs, tokenizer.pad_token_id or 0)


def train_drills(model, tokenizer, sentences: list[str], steps: int,
                 lengths: tuple[int, ...] = (64, 96, 128), batch_size: int = 16,
                 lr: float = 1e-3, seed: int = 0, replay: bool = True,
                 world: World | None = None, reading_share: float = 0.0,
                 reading_filler: tuple[int, int] = (0, 60), progress: bool = True,
                 checkpoint=None, checkpoint_every: int = 50,
                 checkpoint_key: str = "") -> list[float]:
    """Fine-tune ``model`` on ``steps`` batches of never-repeated drills: needle drills
    whose haystack is ``sentences`` and, with ``world``, a ``reading_share`` of reading
    drills (:func:`reading_drill_batch`). Each step's loss is the answer's cross-entropy
    plus, with ``replay``, that of the context text: with the world's own sentences as
    haystack, the second term replays the corpus, so the model learns to copy without
    forgetting the world. Every draw is a function of ``(seed, step)``, so a resumed run
    (``checkpoint``, see :func:`plasticlm.models.train_steps`) repeats the uninterrupted
    one. Returns the losses."""
    pad = tokenizer.pad_token_id or 0
    if reading_share and world is None:
        raise ValueError("reading drills need the world (world=...)")

    device = next(model.parameters()).device

    def loss_at(step: int) -> torch.Tensor:
        draw = random.Random(seed * 100_003 + step)
        length = draw.choice(lengths)
        # Seeds far from the evaluation's (0..) so no drill repeats an evaluated needle.
        batch_seed = 1_000_000 + 10_007 * seed + step
        reading = draw.random() < reading_share
        if reading:
            ids, answer = reading_drill_batch(world, tokenizer, batch_size, reading_filler,
                                              batch_seed)
        else:
            ids, answer = niah_drill_batch(tokenizer, sentences, batch_size, length, batch_seed)
        ids, answer = ids.to(device), answer.to(device)
        text = ids.masked_fill((answer != -100) | (ids == pad), -100)
        logits = model(input_ids=ids).logits[:, :-1].flatten(0, 1).float()
        loss = F.cross_entropy(logits, answer[:, 1:].flatten(), ignore_index=-100)
        # Replay only the world's own sentences: a reading drill's passage states random
        # values for a made-up entity, and learning them as text corrupts what the model knows.
        if replay and not reading:
            loss = loss + F.cross_entropy(logits, text[:, 1:].flatten(), ignore_index=-100)
        return loss

    return train_steps(model, loss_at, steps, lr=lr, warmup=min(20, steps // 5 + 1),
                       desc="context drills", progress=progress, checkpoint=checkpoint,
                       checkpoint_every=checkpoint_every,
                       checkpoint_key=f"drills:{checkpoint_key}:{seed}:{lengths}:{batch_size}:"
                                      f"{replay}:{reading_share}:{reading_filler}")


def teach_facts(model, tokenizer, facts: list[tuple[str, str]], steps: int,
                batch_size: int = 32, lr: float = 1e-3, seed: int = 0,
                replay: list[str] | None = None, replay_batch: int = 16,
                replay_len: int = 128, progress: bool = True) -> list[float]:
    """Fine-tune ``model`` (all weights) on ``facts``, ``(prompt, continuation)`` pairs:
    ``steps`` AdamW steps on batches drawn from ``(seed, step)``, cross-entropy on the
    continuation's tokens only, so the prompts' wording is not learned as text. With
    ``replay`` (general texts), each step adds the LM loss of ``replay_batch`` blocks of
    them: answer-only training otherwise unlearns the language (docs/sandbox.md).
    Returns the losses."""
    if not facts:
        raise ValueError("teach_facts needs at least one (prompt, answer) pair")
    pairs = [encode_pair(tokenizer, p, a) for p, a in facts]
    pad = tokenizer.pad_token_id or 0
    blocks = pack_corpus(tokenizer, replay, replay_len) if replay else None
    device = next(model.parameters()).device

    def loss_at(step: int) -> torch.Tensor:
        draw = random.Random(seed * 100_003 + step)
        ids, answer = _answer_batch([pairs[draw.randrange(len(pairs))]
                                     for _ in range(batch_size)], pad)
        ids, answer = ids.to(device), answer.to(device)
        logits = model(input_ids=ids).logits[:, :-1].flatten(0, 1).float()
        loss = F.cross_entropy(logits, answer[:, 1:].flatten(), ignore_index=-100)
        if blocks is not None:
            rows = blocks[[draw.randrange(len(blocks)) for _ in range(replay_batch)]]
            loss = loss + lm_loss(model, rows)
        return loss

    return train_steps(model, loss_at, steps, lr=lr, warmup=min(20, steps // 5 + 1),
                       desc="fact drills", progress=progress)
