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

import torch
from tqdm.auto import tqdm

from plasticlm.config import Field, configclass
from plasticlm.errors import PlasticError
from plasticlm.eval import pad_id_of
from plasticlm.refine.cache import stack_caches
from plasticlm.refine.examples import Example
from plasticlm.refine.fusers.align import LayerMap
from plasticlm.refine.fusers.fuser import Fuser
from plasticlm.refine.fusers.fuser_config import FuserKind, FusionMode, Share
from plasticlm.refine.fusers.objectives import (
    OBJECTIVES,
    Objective,
    Step,
    needs_choices,
    needs_teacher,
)
from plasticlm.refine.fusers.prepared import (
    Prepared,
    answer_loss,
    batch_answer_loss,
    batch_choice_logprobs,
    fused_batch_state,
    fused_state,
    prepare_example,
    prepare_examples,
)
from plasticlm.refine.peer import Peer


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
    objective: Objective = Field("answer", description="what the fuser learns "
                                 "(OBJECTIVES): answer (C2C's answer cross-entropy), cache "
                                 "(regression toward a teacher's cache), entity-cache (only "
                                 "at the entity's tokens), answer+cache, "
                                 "choice-kl (the transmitter's own distribution over an "
                                 "item's choices: no label, no oracle) or answer+choice-kl")
    seed: int = Field(0, description="seed of the fuser's initialisation and batch order")

    def __post_init__(self):
        if self.private and self.mode != "prefix":
            raise PlasticError("private training (rephrased transmitter prompts) needs "
                               "mode=prefix")
        if needs_teacher(self.objective) and self.mode != "aligned":
            raise PlasticError(f"objective {self.objective!r} regresses the fused cache toward "
                               "a teacher's, which needs mode=aligned")
        if self.share == "draft" and (self.mode != "prefix" or self.draft_tokens < 1):
            raise PlasticError("share='draft' needs mode='prefix' and draft_tokens >= 1 (the "
                               "drafted tokens are what is shared)")


def loss_summary(losses: list[float]) -> dict:
    """Steps and the mean loss of the first and last tenth of them."""
    k = max(1, len(losses) // 10)
    return {"steps": len(losses), "first_loss": round(sum(losses[:k]) / k, 4),
            "last_loss": round(sum(losses[-k:]) / k, 4)}


def train_fuser(receiver: Peer, transmitter: Peer, examples: list[Example],
                cfg: FuserTrainConfig | None = None, progress: bool = True,
                log=None, prepared: list[Prepared] | None = None,
                teacher: Peer | None = None) -> tuple[Fuser, list[float]]:
    """Train a fresh fuser (transmitter -> receiver) on ``examples``; returns it and the
    per-step losses. ``log(step=, loss=, lr=)`` is called every 20 steps when given."""
    fusers, losses = train_fusers(receiver, [transmitter], examples, cfg, progress, log,
                                  None if prepared is None else [prepared], teacher)
    return fusers[0], losses


def train_fusers(receiver: Peer, transmitters: list[Peer], examples: list[Example],
                 cfg: FuserTrainConfig | None = None, progress: bool = True, log=None,
                 prepared: list[list[Prepared]] | None = None, teacher: Peer | None = None
                 ) -> tuple[list[Fuser], list[float]]:
    """Train one fresh fuser per transmitter, all into ``receiver``, on ``examples``;
    returns them and the per-step losses. With several transmitters (aligned mode only) each
    step fuses a random non-empty subset of them in parallel, each transmitter in with
    probability 1/2 (C2C's bitmask), so that at inference any subset summed by FedRefine's
    parallel ``multi`` is in distribution. ``prepared[i]``: :func:`prepare_examples` of
    transmitter ``i``; ``teacher``: the model whose cache the ``cache`` objectives regress
    toward (the receiver's architecture and tokenizer)."""
    cfg = cfg or FuserTrainConfig()
    if needs_teacher(cfg.objective) and teacher is None and prepared is None:
        raise PlasticError(f"objective {cfg.objective!r} needs a teacher: a model of the "
                           "receiver's architecture and tokenizer that knows what the "
                           "transmitter knows")
    if not examples:
        raise PlasticError("no training examples for the fuser")
    if not transmitters:
        raise PlasticError("train_fusers needs at least one transmitter")
    if len(transmitters) > 1 and needs_choices(cfg.objective):
        raise PlasticError(f"objective {cfg.objective!r} matches one transmitter's answers; "
                           "train each transmitter's fuser on its own (train_fuser)")
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
        prepared = [prepare_examples(receiver, t, examples, cfg, progress,
                                     teacher if needs_teacher(cfg.objective) else None)
                    for t in transmitters]
    if "entity-cache" in cfg.objective.split("+") and any(
            not p.focus for ps in prepared for p in ps):
        raise PlasticError(f"objective {cfg.objective!r} needs each example's entity "
                           "(Example.entity, a name that occurs in its prompt)")
    if needs_choices(cfg.objective) and any(p.target is None for ps in prepared for p in ps):
        raise PlasticError(f"objective {cfg.objective!r}: the prepared examples have no "
                           "choice targets (prepare them with this objective)")
    if needs_teacher(cfg.objective) and any(p.teacher is None for ps in prepared for p in ps):
        raise PlasticError(f"objective {cfg.objective!r}: the prepared examples have no "
                           "teacher cache (prepare them with teacher=...)")
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
                batch = [prepared[subset[0]][j] for j in rows]
                loss = OBJECTIVES[cfg.objective](Step(
                    state, batch, lambda b=batch, st=state: batch_answer_loss(
                        receiver.model, pad_id, st, b),
                    lambda b=batch, st=state: batch_choice_logprobs(
                        receiver.model, pad_id, st, b)))
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
        p = prepare_example(receiver, transmitter, ex, mode, fuse_last, draft)
        state = fused_state(fuser, p, receiver.layout) if fuser is not None else p.own
        total += float(answer_loss(receiver.model, state, p.tail, p.answer, p.start))
    return total / len(examples)
