"""What a fuser is trained to do, one registered objective per name (``OBJECTIVES``):

- ``answer`` (C2C's): the receiver's next-token cross-entropy on the answer tokens after
  the fused cache;
- ``cache``: cache regression toward a *teacher*, a model of the receiver's architecture and
  tokenizer that knows what the transmitter knows (on the sandbox, the receiver taught the
  facts): the fused K/V should equal the teacher's K/V of the same prompt. The loss is the
  share of the cache gap left, sum over layers and real positions of ||fused - teacher||^2
  divided by ||receiver - teacher||^2 (1.0 for a fuser that adds nothing, 0 when the fused
  cache is the teacher's; by ||teacher||^2 when the teacher is the receiver). It gives a target at every position and layer, where the answer
  loss gives one through a few answer tokens;
- ``answer+cache``: their sum;
- ``entity-cache``: the cache regression at the tokens of the entity the prompt asks about
  only (``Example.entity``), where the receiver was measured to use what it knows (a
  diagnostic and a ceiling: it needs the teacher);
- ``choice-kl``: distillation toward the transmitter's own answer, across vocabularies at
  the level of answers: KL(p_T || p_R) between the transmitter's distribution over a
  multiple-choice item's choices (softmax of each choice's summed log-probability in its own
  vocabulary, computed once when the examples are prepared) and the receiver's from the fused
  cache. It needs no gold answer and no oracle, only a transmitter that knows: the objective
  a real federation can use (``answer+choice-kl`` adds C2C's answer loss on the labels).

An objective is ``loss(step) -> scalar tensor`` over a :class:`Step` (the receiver, the batch's
prepared examples and their fused, stacked cache).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import torch

from plasticlm.errors import PlasticError
from plasticlm.refine.cache import KVCache, stack_caches
from plasticlm.registry import Registry

OBJECTIVES: Registry[Callable[..., torch.Tensor]] = Registry("fuser objective")


@dataclass
class Step:
    """One training step's inputs: ``state`` is the fused cache of ``batch`` (stacked,
    left-padded); ``answer_loss()`` the receiver's answer cross-entropy from it."""

    state: KVCache
    batch: list            # prepared.Prepared, with .own and .teacher caches
    answer_loss: Callable[[], torch.Tensor]
    # per example, [C] the receiver's log-probabilities of its choices from ``state``
    choice_logprobs: Callable[[], list[torch.Tensor]] | None = None


def needs_teacher(name: str) -> bool:
    """Whether objective ``name`` regresses toward a teacher's cache."""
    return any(part in ("cache", "entity-cache") for part in name.split("+"))


def needs_choices(name: str) -> bool:
    """Whether objective ``name`` matches the transmitter's distribution over choices."""
    return "choice-kl" in name.split("+")


@OBJECTIVES.register("answer")
def answer_objective(step: Step) -> torch.Tensor:
    return step.answer_loss()


def cache_gap(state: KVCache, own: KVCache, teacher: KVCache,
              focus: torch.Tensor | None = None) -> torch.Tensor:
    """sum ||state - teacher||^2 / sum ||own - teacher||^2 over layers, K and V, and the
    real (unpadded) positions, or only those where ``focus`` [B, T] is 1; all three caches
    ``[B, heads, T, dim]`` per layer, one mask."""
    keep = own.mask if focus is None else own.mask * focus.to(own.mask.device)
    mask = keep[:, None, :, None].to(state.keys[0].dtype)
    left = gap = energy = torch.zeros((), device=mask.device)
    for ours, base, target in ((state.keys, own.keys, teacher.keys),
                               (state.values, own.values, teacher.values)):
        for s, o, t in zip(ours, base, target):
            t = t.float()
            left = left + (((s.float() - t) ** 2) * mask).sum()
            gap = gap + (((o.float() - t) ** 2) * mask).sum()
            energy = energy + ((t ** 2) * mask).sum()
    # A teacher that is the receiver leaves no gap: measure against the cache's size instead.
    scale = gap if gap > 1e-6 * energy else energy
    return left / scale.clamp_min(1e-12)


@OBJECTIVES.register("cache")
def cache_objective(step: Step) -> torch.Tensor:
    own = stack_caches([p.own for p in step.batch])
    teacher = stack_caches([p.teacher for p in step.batch])
    return cache_gap(step.state, own, teacher)


def focus_mask(batch: list) -> torch.Tensor:
    """[B, T] 1 at each prepared example's entity positions, left-padded as the stacked
    caches are (:func:`stack_caches`)."""
    width = max(p.own.length for p in batch)
    out = torch.zeros(len(batch), width)
    for i, p in enumerate(batch):
        if not p.focus:
            raise PlasticError("entity-cache needs examples whose entity occurs in the "
                               "prompt (Example.entity)")
        pad = width - p.own.length
        out[i, [pad + j for j in p.focus]] = 1.0
    return out


@OBJECTIVES.register("entity-cache")
def entity_cache_objective(step: Step) -> torch.Tensor:
    own = stack_caches([p.own for p in step.batch])
    teacher = stack_caches([p.teacher for p in step.batch])
    return cache_gap(step.state, own, teacher, focus_mask(step.batch))


@OBJECTIVES.register("answer+cache")
def answer_and_cache_objective(step: Step) -> torch.Tensor:
    return answer_objective(step) + cache_objective(step)


Objective = Annotated[str, OBJECTIVES.key]


def choice_kl(target: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """KL(target || softmax(logprobs)) over one item's choices, both [C]."""
    target = target.to(logprobs.device)
    log_q = torch.log_softmax(logprobs, dim=0)
    return (target * (torch.log(target.clamp_min(1e-12)) - log_q)).sum()


@OBJECTIVES.register("choice-kl")
def choice_kl_objective(step: Step) -> torch.Tensor:
    scores = step.choice_logprobs()
    return torch.stack([choice_kl(p.target, s) for p, s in zip(step.batch, scores)]).mean()


@OBJECTIVES.register("answer+choice-kl")
def answer_and_choice_kl_objective(step: Step) -> torch.Tensor:
    return answer_objective(step) + choice_kl_objective(step)
