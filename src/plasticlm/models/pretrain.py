"""Train a byte-level BPE tokenizer and pre-train a small causal LM on plain text."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast

from plasticlm.models.checkpoint import (
    TrainState,
    load_checkpoint,
    remove_checkpoint,
    save_checkpoint,
)

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 1024, min_frequency: int = 2):
    """A byte-level BPE fast tokenizer trained on ``texts``; ids 0-3 are pad, bos, eos, unk.

    Encoding adds no special tokens; :func:`pack_corpus` places BOS itself.
    """
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


def encode_documents(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Each text as ``[bos] + tokens + [eos]``."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return [[bos, *x, eos] for x in ids]


def pack_corpus(tokenizer, texts: Sequence[str], seq_len: int) -> torch.Tensor:
    """Concatenate BOS/EOS-delimited documents and cut into blocks ``[N, seq_len + 1]``."""
    flat = [t for doc in encode_documents(tokenizer, texts) for t in doc]
    n = (len(flat) - 1) // seq_len
    if n < 1:
        raise ValueError(f"corpus of {len(flat)} tokens is shorter than one block of {seq_len}")
    return _blocks(torch.tensor(flat[: n * seq_len + 1]), n, seq_len)


def _blocks(data: torch.Tensor, n: int, seq_len: int) -> torch.Tensor:
    """``n`` consecutive blocks ``[n, seq_len + 1]`` of ``data``, each sharing its last
    token with the next block's first (the targets of one are the inputs of the next)."""
    return data[torch.arange(n)[:, None] * seq_len + torch.arange(seq_len + 1)[None]]


def lm_loss(model, blocks: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``model`` on blocks ``[B, T+1]``."""
    blocks = blocks.to(next(model.parameters()).device)
    logits = model(blocks[:, :-1]).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), blocks[:, 1:].flatten())


@torch.no_grad()
def evaluate_loss(model, blocks: torch.Tensor, batch_size: int = 16) -> float:
    """Token-weighted mean cross-entropy (nats/token) over ``blocks``."""
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(blocks), batch_size):
        b = blocks[i : i + batch_size]
        total += lm_loss(model, b).item() * len(b)
    model.train(was_training)
    return total / len(blocks)


def unigram_loss(train_blocks: torch.Tensor, eval_blocks: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy of the add-one unigram distribution of ``train_blocks`` on ``eval_blocks``."""
    counts = torch.bincount(train_blocks[:, 1:].flatten(), minlength=vocab_size).double() + 1
    logp = (counts / counts.sum()).log()
    return -logp[eval_blocks[:, 1:].flatten()].mean().item()


def train_steps(model, loss_at: Callable[[int], torch.Tensor], steps: int, lr: float = 2e-3,
                warmup: int = 50, weight_decay: float = 0.01, desc: str = "train",
                progress: bool = True, checkpoint: str | Path | None = None,
                checkpoint_every: int = 50, checkpoint_key: str = "") -> list[float]:
    """AdamW with linear warm-up, cosine decay to 10% and gradient clipping at 1;
    ``loss_at(step)`` computes one step's loss and must depend on ``step`` alone (not on
    hidden state), so that a resumed run draws the same batches. Returns the losses.

    With ``checkpoint`` (a folder), the run saves itself every ``checkpoint_every`` steps and
    a re-run with the same ``checkpoint_key`` continues from the last save; the folder is
    removed when the run completes.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    key = json.dumps({"key": checkpoint_key, "steps": steps, "lr": lr, "warmup": warmup,
                      "weight_decay": weight_decay}, sort_keys=True)
    state = TrainState(0, [])
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, model, opt, sched, key) or state
    model.train()
    bar = tqdm(range(state.step, steps), desc=desc, disable=not progress, leave=False,
               initial=state.step, total=steps)
    for step in bar:
        loss = loss_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        state.losses.append(loss.item())
        state.step = step + 1
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)  # drawn at tqdm's interval
        if checkpoint is not None and state.step % checkpoint_every == 0 and state.step < steps:
            save_checkpoint(checkpoint, model, opt, sched, state, key)
    model.eval()
    if checkpoint is not None:
        remove_checkpoint(checkpoint)
    return state.losses


def step_generator(seed: int, step: int) -> torch.Generator:
    """A generator for one step's random draws: a function of ``(seed, step)`` only, so a
    resumed run draws what the uninterrupted one would have."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def train_lm(model, blocks: torch.Tensor, steps: int, batch_size: int = 32, lr: float = 2e-3,
             warmup: int = 50, weight_decay: float = 0.01, seed: int = 0,
             desc: str = "pre-train", progress: bool = True, checkpoint: str | Path | None = None,
             checkpoint_every: int = 50, checkpoint_key: str = "") -> list[float]:
    """:func:`train_steps` over random blocks ``[N, T+1]``; returns the losses."""

    def loss_at(step: int) -> torch.Tensor:
        idx = torch.randint(len(blocks), (min(batch_size, len(blocks)),),
                            generator=step_generator(seed, step))
        return lm_loss(model, blocks[idx])

    return train_steps(model, loss_at, steps, lr, warmup, weight_decay, desc, progress,
                       checkpoint, checkpoint_every, checkpoint_key)


def packed_batch(tokenizer, documents: Sequence[str], batch_size: int, seq_len: int,
                 rng: random.Random,
                 augment: Callable[[str, random.Random], str] | None = None) -> torch.Tensor:
    """``[batch_size, seq_len + 1]`` tokens packed afresh: documents drawn by ``rng`` (with
    replacement, each passed through ``augment(doc, rng)`` when given), BOS/EOS-delimited and
    concatenated until they fill the batch; the rows are consecutive pieces of that stream,
    starting at a random offset inside the first document, so a block's boundaries and
    neighbours change from draw to draw."""
    need = batch_size * seq_len + 1
    flat: list[int] = []
    while len(flat) < need:
        doc = documents[rng.randrange(len(documents))]
        flat.extend(encode_documents(tokenizer, [augment(doc, rng) if augment else doc])[0])
    start = rng.randrange(len(flat) - need + 1)
    return _blocks(torch.tensor(flat[start:start + need]), batch_size, seq_len)


def train_lm_repacked(model, tokenizer, documents: Sequence[str], steps: int, seq_len: int,
                      batch_size: int = 32, lr: float = 2e-3, warmup: int = 50,
                      weight_decay: float = 0.01, seed: int = 0,
                      augment: Callable[[str, random.Random], str] | None = None,
                      desc: str = "pre-train", progress: bool = True,
                      checkpoint: str | Path | None = None, checkpoint_every: int = 50,
                      checkpoint_key: str = "") -> list[float]:
    """:func:`train_steps` over batches :func:`packed_batch` draws afresh from ``documents``
    at every step (from ``(seed, step)``, so a resumed run repeats the uninterrupted one),
    where :func:`train_lm` samples the fixed blocks of one packing. On a small corpus seen
    many times, the fixed blocks are memorised with their neighbours; ``augment`` (a
    document's sentences in a new order, say) varies what is memorised. The seed, lengths
    and batch size are part of the checkpoint's key; ``checkpoint_key`` must name the
    documents and the augmentation. Returns the losses."""
    if not documents:
        raise ValueError("train_lm_repacked needs at least one document")
    # One stride per seed longer than the run, so two seeds never share a step's batch (the
    # 7919 of the measured sandbox runs, which were shorter).
    stride = max(7919, steps)

    def loss_at(step: int) -> torch.Tensor:
        rng = random.Random(seed * stride + step)
        return lm_loss(model, packed_batch(tokenizer, documents, batch_size, seq_len, rng,
                                           augment))

    return train_steps(model, loss_at, steps, lr, warmup, weight_decay, desc, progress,
                       checkpoint, checkpoint_every,
                       f"repacked:{checkpoint_key}:{seed}:{seq_len}:{batch_size}")


Segments = Sequence[tuple[str, bool | float]]


def packed_segment_batch(tokenizer, draw: Callable[[random.Random], Segments], batch_size: int,
                         seq_len: int, rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, in_loss)``, both ``[batch_size, seq_len + 1]``, packed afresh from
    documents ``draw(rng)`` returns as ``(text, in_loss)`` segments (each encoded on its own,
    so an answer's tokens are those a scorer sees after its prompt); ``in_loss[b, t]`` says
    whether token t is a target of the loss (BOS and EOS always are). Each row starts at a
    document's BOS and holds whole documents, the last one cut at the row's end, so every
    target sees its document from the start: a stream cut into rows (as :func:`packed_batch`
    does) left 89% of open-book answers without their passage at 256 tokens.

    A segment's ``in_loss`` may also be a float, the weight of its tokens in the loss
    (:func:`masked_lm_loss`; BOS and EOS weigh 1): then ``in_loss`` comes back as a float
    tensor of weights, else as a bool tensor."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    rows: list[list[int]] = []
    masks: list[list[float]] = []
    weighted = False
    for _ in range(batch_size):
        flat: list[int] = []
        mask: list[float] = []
        while len(flat) < seq_len + 1:
            segments = draw(rng)
            encoded = tokenizer([t for t, _ in segments], add_special_tokens=False)["input_ids"]
            flat.append(bos)
            mask.append(1.0)
            for ids, (_, in_loss) in zip(encoded, segments):
                weighted = weighted or not isinstance(in_loss, bool)
                flat.extend(ids)
                mask.extend([float(in_loss)] * len(ids))
            flat.append(eos)
            mask.append(1.0)
        rows.append(flat[:seq_len + 1])
        masks.append(mask[:seq_len + 1])
    weights = torch.tensor(masks)
    return torch.tensor(rows), (weights if weighted else weights > 0)


def masked_lm_loss(model, tokens: torch.Tensor, in_loss: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the targets ``in_loss`` marks (``[B, T+1]`` each);
    a float ``in_loss`` weighs each target (the weighted mean, over weights > 0)."""
    device = next(model.parameters()).device
    tokens, in_loss = tokens.to(device), in_loss.to(device)
    logits = model(tokens[:, :-1]).logits
    if in_loss.dtype != torch.bool:
        w = in_loss[:, 1:].float().flatten()
        ce = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten(),
                             reduction="none")
        return (ce * w).sum() / w.sum().clamp_min(1e-8)
    targets = tokens[:, 1:].masked_fill(~in_loss[:, 1:], -100)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


def train_lm_segments(model, tokenizer, draw: Callable[[random.Random, int], Segments], steps: int,
                      seq_len: int, batch_size: int = 8, lr: float = 2e-3, warmup: int = 50,
                      weight_decay: float = 0.01, seed: int = 0, desc: str = "pre-train",
                      progress: bool = True, checkpoint: str | Path | None = None,
                      checkpoint_every: int = 50, checkpoint_key: str = "") -> list[float]:
    """:func:`train_steps` over batches :func:`packed_segment_batch` packs afresh at every
    step from ``draw(rng, step)`` (``rng`` a ``random.Random`` of ``(seed, step)``, so a
    resumed run repeats the uninterrupted one; ``step`` lets the mix follow a curriculum);
    the loss is on the segments marked for it. ``checkpoint_key``
    must name what ``draw`` draws. Returns the losses."""
    stride = max(7919, steps)

    def loss_at(step: int) -> torch.Tensor:
        rng = random.Random(seed * stride + step)
        return masked_lm_loss(model, *packed_segment_batch(
            tokenizer, lambda r: draw(r, step), batch_size, seq_len, rng))

    return train_steps(model, loss_at, steps, lr, warmup, weight_decay, desc, progress,
                       checkpoint, checkpoint_every,
                       f"segments:{checkpoint_key}:{seed}:{seq_len}:{batch_size}")
