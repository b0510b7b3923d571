"""Training a fuser: both LLMs frozen, receiver next-token cross-entropy on answer tokens.

Because both models are frozen, their caches of every training prompt are computed once;
each step then costs one fuser pass per example and one receiver forward over the batch's
answer tokens (fused caches left-padded, answers right-padded; the loss is the mean of the
examples' mean answer cross-entropies). The
C2C layer gates' Gumbel-sigmoid temperature anneals geometrically from ``temperature_start``
to ``temperature_end`` over training.

Two uses: :func:`general_examples` gives C2C's general pre-training data (the world's corpus
continuations and Q/A lines, no private fact); task examples (:func:`make_examples`) train a
task-specific fuser.
"""


from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from plasticlm.config import Field, configclass
from plasticlm.errors import PlasticError
from plasticlm.eval import pad_batch, pad_id_of
from plasticlm.refine.align import LayerMap, align_tokens
from plasticlm.refine.cache import KVCache, continue_from_cache, extract_cache, stack_caches
from plasticlm.refine.examples import Example
from plasticlm.refine.fuser import Fuser
from plasticlm.refine.fuser_config import FuserKind, FusionMode, Share
from plasticlm.refine.peer import Peer, as_batch, continuation_ids, prompt_ids, transmitter_ids


@configclass
class FuserTrainConfig:
    """Fuser shape and optimiser (AdamW, linear warm-up then cosine, grad clip as in C2C)."""

    kind: FuserKind = Field("c2c", description="the per-layer fuser module (FUSER_KINDS)")
    rank: int = Field(32, ge=1, description="lowrank: bottleneck width")
    hidden: int = Field(128, ge=1, description="c2c: hidden width of the K and V paths")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="c2c: dropout in the residual "
                           "blocks")
    layer_map: LayerMap = Field("last", description="which transmitter layer each receiver "
                                "layer reads (see FuserConfig.layer_map)")
    mode: FusionMode = Field("aligned", description="fusion mode (see FuserConfig.mode)")
    private: bool = Field(False, description="prefix mode: the transmitter reads rephrased "
                          "prompts")
    fuse_last: bool = Field(False, description="aligned mode: see FuserConfig.fuse_last")
    draft_tokens: int = Field(0, ge=0, description="prefix mode: see FuserConfig.draft_tokens")
    share: Share = Field("all", description="prefix mode: see FuserConfig.share")
    epochs: int = Field(2, gt=0, description="passes over the training examples")
    batch_size: int = Field(16, gt=0, description="examples per step")
    lr: float = Field(1e-3, gt=0, description="AdamW peak learning rate")
    warmup_fraction: float = Field(0.1, ge=0.0, le=1.0, description="share of the steps of "
                                   "linear warm-up before the cosine decay")
    grad_clip: float = Field(1.0, gt=0, description="gradient norm clip")
    weight_decay: float = Field(0.01, ge=0.0, description="AdamW weight decay")
    temperature_start: float = Field(1.0, gt=0, description="c2c gates: Gumbel-sigmoid "
                                     "temperature at the first step")
    temperature_end: float = Field(0.001, gt=0, description="c2c gates: temperature at the "
                                   "last step (geometric schedule)")
    seed: int = Field(0, description="seed of the fuser's initialisation and batch order")

    def __post_init__(self):
        if self.private and self.mode != "prefix":
            raise PlasticError("private training (rephrased transmitter prompts) needs "
                               "mode=prefix")
        if self.share == "draft" and (self.mode != "prefix" or self.draft_tokens < 1):
            raise PlasticError("share='draft' needs mode='prefix' and draft_tokens >= 1 (the "
                               "drafted tokens are what is shared)")


@dataclass
class _Prepared:
    own: KVCache | None          # receiver cache before fusion (aligned) or its BOS (prefix)
    transmitter: KVCache
    index: torch.Tensor | None
    tail: list[int]
    answer: list[int]
    start: int | None = None     # position of tail[0] when not right after the cache
    prompt_length: int | None = None  # prefix mode: transmitter tokens before its draft


def _prepare(receiver: Peer, transmitter: Peer, ex: Example, mode: str,
             fuse_last: bool = False, draft_tokens: int = 0) -> _Prepared:
    r_ids = prompt_ids(receiver.tokenizer, ex.prompt)
    answer = continuation_ids(receiver.tokenizer, r_ids, ex.prompt, ex.answer)
    if mode == "aligned":
        al = align_tokens(receiver.tokenizer, transmitter.tokenizer, ex.prompt)
        n = len(r_ids) if fuse_last else len(r_ids) - 1
        own, _ = extract_cache(receiver.model, as_batch(r_ids[:n]))
        t_cache, _ = extract_cache(transmitter.model, as_batch(al.transmitter_ids))
        return _Prepared(own, t_cache, torch.tensor([al.index[:n]]), r_ids[-1:], answer,
                         len(r_ids) - 1)
    text = ex.transmitter_text or ex.prompt
    t_cache, _ = extract_cache(transmitter.model,
                               as_batch(transmitter_ids(transmitter, text, draft_tokens)))
    n = len(prompt_ids(transmitter.tokenizer, text))
    bos = receiver.tokenizer.bos_token_id
    if bos is not None and r_ids[0] == bos:
        own, _ = extract_cache(receiver.model, as_batch(r_ids[:1]))
        return _Prepared(own, t_cache, None, r_ids[1:], answer, prompt_length=n)
    return _Prepared(None, t_cache, None, r_ids, answer, prompt_length=n)


def fused_state(fuser: Fuser, p: _Prepared, receiver_layout) -> KVCache:
    """The receiver state a prepared example is scored from (gradients reach the fuser)."""
    if fuser.config.mode == "aligned":
        return fuser.fuse_aligned(p.own, p.transmitter, p.index)
    start = 1 if p.own is not None else 0
    prefix = fuser.prefix(p.transmitter, receiver_layout, start=start,
                          prompt_length=p.prompt_length)
    return p.own.cat(prefix) if p.own is not None else prefix


def answer_loss(receiver_model, state: KVCache, tail: list[int], answer: list[int],
                start: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of ``answer`` tokens after running ``tail`` on ``state`` (``tail[0]``
    at position ``start``, default right after the cache)."""
    ids = as_batch(tail + answer[:-1])
    starts = None if start is None else torch.tensor([start])
    logits = continue_from_cache(receiver_model, state, ids,
                                 start_positions=starts)[0, len(tail) - 1:]
    target = torch.tensor(answer, device=logits.device)
    return torch.nn.functional.cross_entropy(logits.float(), target)


def fused_batch_state(fuser: Fuser, batch: list[_Prepared], receiver_layout) -> KVCache:
    """The fused states of a batch, stacked (left-padded). Aligned fusion runs once on the
    stacked caches (each row's transmitter index shifted by its padding); prefix fusion runs
    per example."""
    if fuser.config.mode != "aligned":
        return stack_caches([fused_state(fuser, p, receiver_layout) for p in batch])
    own = stack_caches([p.own for p in batch])
    sent = stack_caches([p.transmitter for p in batch])
    index = torch.zeros(len(batch), own.length, dtype=torch.long)
    for i, p in enumerate(batch):
        index[i, own.length - p.own.length:] = p.index[0] + (sent.length - p.transmitter.length)
    return fuser.fuse_aligned(own, sent, index)


def batch_answer_loss(receiver_model, pad_id: int, state: KVCache, batch: list[_Prepared]
                      ) -> torch.Tensor:
    """The mean over examples of :func:`answer_loss`, in one receiver forward from the
    stacked states (:func:`fused_batch_state`), each example's tail + answer right-padded."""
    ids, mask = pad_batch([p.tail + p.answer[:-1] for p in batch], pad_id)
    starts = torch.tensor([p.start if p.start is not None else int(state.mask[i].sum())
                           for i, p in enumerate(batch)])
    logits = continue_from_cache(receiver_model, state, ids, mask, start_positions=starts)
    losses = []
    for i, p in enumerate(batch):
        rows = logits[i, len(p.tail) - 1: len(p.tail) - 1 + len(p.answer)]
        target = torch.tensor(p.answer, device=rows.device)
        losses.append(torch.nn.functional.cross_entropy(rows.float(), target))
    return torch.stack(losses).mean()


def prepare_examples(receiver: Peer, transmitter: Peer, examples: list[Example],
                     cfg: FuserTrainConfig, progress: bool = False) -> list[_Prepared]:
    """Both frozen models' caches of every example, as :func:`train_fuser` uses them; they
    depend on the fusion mode, ``fuse_last`` and ``draft_tokens`` only, so one list serves
    every seed."""
    return [_prepare(receiver, transmitter, ex, cfg.mode, cfg.fuse_last, cfg.draft_tokens)
            for ex in tqdm(examples, desc="caches", disable=not progress, leave=False)]


def loss_summary(losses: list[float]) -> dict:
    """Steps and the mean loss of the first and last tenth of them."""
    k = max(1, len(losses) // 10)
    return {"steps": len(losses), "first_loss": round(sum(losses[:k]) / k, 4),
            "last_loss": round(sum(losses[-k:]) / k, 4)}


def train_fuser(receiver: Peer, transmitter: Peer, examples: list[Example],
                cfg: FuserTrainConfig | None = None, progress: bool = True,
                log=None, prepared: list[_Prepared] | None = None) -> tuple[Fuser, list[float]]:
    """Train a fresh fuser (transmitter -> receiver) on ``examples``; returns it and the
    per-step losses. ``log(step=, loss=, lr=)`` is called every 20 steps when given."""
    fusers, losses = train_fusers(receiver, [transmitter], examples, cfg, progress, log,
                                  None if prepared is None else [prepared])
    return fusers[0], losses


def train_fusers(receiver: Peer, transmitters: list[Peer], examples: list[Example],
                 cfg: FuserTrainConfig | None = None, progress: bool = True, log=None,
                 prepared: list[list[_Prepared]] | None = None
                 ) -> tuple[list[Fuser], list[float]]:
    """Train one fresh fuser per transmitter, all into ``receiver``, on ``examples``;
    returns them and the per-step losses. With several transmitters (aligned mode only) each
    step fuses a random non-empty subset of them in parallel, each transmitter in with
    probability 1/2 (C2C's bitmask), so that at inference any subset summed by FedRefine's
    parallel ``multi`` is in distribution. ``prepared[i]``: :func:`prepare_examples` of
    transmitter ``i``."""
    cfg = cfg or FuserTrainConfig()
    if not examples:
        raise PlasticError("no training examples for the fuser")
    if not transmitters:
        raise PlasticError("train_fusers needs at least one transmitter")
    if len(transmitters) > 1 and cfg.mode != "aligned":
        raise PlasticError("fusers trained together are summed in parallel, which needs "
                           f"mode=aligned (got {cfg.mode!r})")
    torch.manual_seed(cfg.seed)
    fusers = [Fuser.for_pair(receiver.layout, t.layout, kind=cfg.kind, rank=cfg.rank,
                             hidden=cfg.hidden, dropout=cfg.dropout, layer_map=cfg.layer_map,
                             mode=cfg.mode, receiver_name=receiver.name,
                             transmitter_name=t.name, fuse_last=cfg.fuse_last,
                             draft_tokens=cfg.draft_tokens, share=cfg.share)
              for t in transmitters]
    device = next(receiver.model.parameters()).device
    for f in fusers:
        f.to(device)
    if prepared is None:
        prepared = [prepare_examples(receiver, t, examples, cfg, progress) for t in transmitters]
    if len(prepared) != len(transmitters) or any(len(p) != len(examples) for p in prepared):
        raise PlasticError(f"prepared caches for {[len(p) for p in prepared]} examples and "
                           f"{len(transmitters)} transmitters, for {len(examples)} examples: "
                           "prepare them with prepare_examples for these examples")
    params = [p for f in fusers for p in f.parameters()]
    per_epoch = math.ceil(len(examples) / cfg.batch_size)
    steps = cfg.epochs * per_epoch
    warmup = max(1, int(cfg.warmup_fraction * steps))
    decay = (cfg.temperature_end / cfg.temperature_start) ** (1 / max(1, steps - 1))
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    frozen = [(p, p.requires_grad) for m in [receiver.model] + [t.model for t in transmitters]
              for p in m.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    pad_id = pad_id_of(receiver.tokenizer)
    rng = random.Random(cfg.seed)
    losses: list[float] = []
    for f in fusers:
        f.train()
    names = "+".join(t.name for t in transmitters)
    try:
        bar = tqdm(total=steps, desc=f"fuser {names}->{receiver.name}", disable=not progress,
                   leave=False)
        for _ in range(cfg.epochs):
            order = list(range(len(examples)))
            rng.shuffle(order)
            for b in range(per_epoch):
                rows = order[b * cfg.batch_size:(b + 1) * cfg.batch_size]
                subset = [0]
                if len(fusers) > 1:
                    subset = []
                    while not subset:
                        subset = [i for i in range(len(fusers)) if rng.random() < 0.5]
                for f in fusers:
                    f.set_temperature(cfg.temperature_start * decay ** len(losses))
                opt.zero_grad(set_to_none=True)
                states = [fused_batch_state(fusers[i], [prepared[i][j] for j in rows],
                                            receiver.layout) for i in subset]
                state = states[0] if len(fusers) == 1 else stack_caches(
                    [prepared[0][j].own for j in rows]).plus_changes(states)
                loss = batch_answer_loss(receiver.model, pad_id, state,
                                         [prepared[subset[0]][j] for j in rows])
                loss.backward()
                total = loss.item()
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                opt.step()
                sched.step()
                losses.append(total)
                if log is not None and len(losses) % 20 == 0:
                    log(step=len(losses), loss=sum(losses[-20:]) / 20,
                        lr=sched.get_last_lr()[0])
                bar.update()
                bar.set_postfix(loss=f"{total:.3f}", refresh=False)
        bar.close()
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
        for f in fusers:
            f.eval()
    return fusers, losses


@torch.no_grad()
def evaluate_answer_loss(receiver: Peer, transmitter: Peer, fuser: Fuser | None,
                         examples: list[Example]) -> float:
    """Mean answer cross-entropy with the fuser (or of the receiver alone when None)."""
    mode = fuser.config.mode if fuser is not None else "aligned"
    fuse_last = fuser.config.fuse_last if fuser is not None else False
    draft = fuser.config.draft_tokens if fuser is not None else 0
    total = 0.0
    for ex in examples:
        p = _prepare(receiver, transmitter, ex, mode, fuse_last, draft)
        state = fused_state(fuser, p, receiver.layout) if fuser is not None else p.own
        total += float(answer_loss(receiver.model, state, p.tail, p.answer, p.start))
    return total / len(examples)
