"""Rewards = acquisition - lambda * forgetting: one registered class per reward (``REWARDS``,
the only list of them; ``scol.reward`` names one): the gold answers' log-likelihood
(``loglik``, the default: continuous, so candidates rarely tie), QA accuracy (``supervised``,
0/1 per question: a reported metric) or the context's own likelihood (``intrinsic``).
Add a reward with ``@REWARDS.register(name)`` on a :class:`RewardProbe` subclass.

Closed-book QA: the model greedily continues ``Q: <question> A:`` (the one QA template,
:func:`plasticlm.eval.qa_prompt`) and the answer, cut at the first newline or full stop, is
graded with SQuAD exact match and F1 against the gold answers. Likelihood terms are mean
next-token NLL in nats/token.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal, get_args

import torch

from plasticlm.errors import PlasticError
from plasticlm.eval import (
    encode_pair,
    generate_texts,
    pad_id_of,
    qa_continuation,
    score_continuations,
    squad_score,
)
from plasticlm.eval import qa_prompt as template_prompt
from plasticlm.registry import Registry
from plasticlm.scol.consolidate import context_windows, lm_loss
from plasticlm.scol.records import Context, Question, Reward

__all__ = ["ANSWER_STOPS", "FORGET_FROM", "REWARDS", "Context", "ForgetFrom", "IntrinsicReward",
           "LoglikReward", "QAMetric", "Question", "Reward", "RewardProbe", "SupervisedReward",
           "answer_loglik", "context_nll", "earlier_contexts", "intrinsic_reward",
           "loglik_reward", "qa_accuracy", "qa_answers", "qa_prompt", "qa_scores",
           "reward_probe", "supervised_reward"]

ANSWER_STOPS = ("\n", ".", " Q:")
QAMetric = Literal["em", "f1"]
# which earlier contexts the forgetting term checks: the last forget_window ("recent"), or
# forget_window drawn from every earlier context of the stream ("all")
ForgetFrom = Literal["recent", "all"]
FORGET_FROM = get_args(ForgetFrom)

def qa_prompt(question: str, prefix: str = "") -> str:
    """:func:`plasticlm.eval.qa_prompt` after ``prefix`` (in-context baselines put contexts
    there)."""
    return prefix + template_prompt(question)


@torch.no_grad()
def qa_answers(model, tokenizer, questions: Sequence[Question], prefix: str = "",
               max_new_tokens: int = 8, batch_size: int = 16) -> list[str]:
    """Greedy closed-book answers, one per question."""
    if not questions:
        return []
    return generate_texts(model, tokenizer, [qa_prompt(q.question, prefix) for q in questions],
                          max_new_tokens=max_new_tokens, batch_size=batch_size,
                          stop=ANSWER_STOPS)


def qa_scores(model, tokenizer, questions: Sequence[Question], prefix: str = "",
              max_new_tokens: int = 8, batch_size: int = 16) -> list[tuple[float, float]]:
    """``(exact_match, f1)`` per question of greedy closed-book answers."""
    preds = qa_answers(model, tokenizer, questions, prefix, max_new_tokens, batch_size)
    return [squad_score(p, list(q.answers)) for p, q in zip(preds, questions)]


def qa_accuracy(model, tokenizer, questions: Sequence[Question], metric: str = "f1",
                prefix: str = "") -> float:
    """Mean exact match or F1 in [0, 1] over ``questions``."""
    if metric not in get_args(QAMetric):
        raise PlasticError(f"QA metric must be 'em' or 'f1', not {metric!r}")
    scores = qa_scores(model, tokenizer, questions, prefix)
    if not scores:
        return 0.0
    j = 0 if metric == "em" else 1
    return sum(s[j] for s in scores) / len(scores)


@torch.no_grad()
def answer_loglik(model, tokenizer, questions: Sequence[Question], batch_size: int = 16
                  ) -> list[float]:
    """Per question, the mean log-probability per token (nats) of its first gold answer
    after the QA prompt, ``log p(" " + answer | "Q: <question> A:") / tokens``."""
    if not questions:
        return []
    pairs = [encode_pair(tokenizer, qa_prompt(q.question), qa_continuation(q.answers[0]))
             for q in questions]
    scores = score_continuations(model, [c for c, _ in pairs], [a for _, a in pairs],
                                 pad_id_of(tokenizer), batch_size)
    return [s.mean_logprob for s in scores]


def loglik_reward(current_before: Sequence[float], current_after: Sequence[float],
                  earlier_before: Sequence[float], earlier_after: Sequence[float],
                  lam: float) -> Reward:
    """Acquisition: the mean gain in the gold answers' log-likelihood (nats/token) on the
    context's questions; forgetting: the mean loss of it on the retention probes (earlier
    contexts' questions); total = acquisition - ``lam`` * forgetting."""
    if len(current_before) != len(current_after) or len(earlier_before) != len(earlier_after):
        raise PlasticError("log-likelihoods before and after must pair up")

    def mean(xs) -> float:
        return sum(xs) / len(xs) if xs else 0.0
    acquisition = mean([a - b for b, a in zip(current_before, current_after)])
    forgetting = mean([b - a for b, a in zip(earlier_before, earlier_after)])
    return Reward(acquisition, forgetting, acquisition - lam * forgetting)


def supervised_reward(acc_current: float, acc_earlier_before: float | None,
                      acc_earlier_after: float | None, lam: float) -> Reward:
    """QA accuracy on the current context minus ``lam`` times the accuracy drop on earlier
    contexts' questions (no earlier questions: no forgetting term)."""
    forgetting = 0.0
    if acc_earlier_before is not None and acc_earlier_after is not None:
        forgetting = acc_earlier_before - acc_earlier_after
    return Reward(acc_current, forgetting, acc_current - lam * forgetting)


def intrinsic_reward(nll_current_before: float, nll_current_after: float,
                     nll_earlier_before: Sequence[float], nll_earlier_after: Sequence[float],
                     lam: float) -> Reward:
    """Log-likelihood gain on the current context (nats/token) minus ``lam`` times the mean
    normalised log-likelihood drop on earlier contexts, ``(nll_after - nll_before) / nll_before``.
    """
    if len(nll_earlier_before) != len(nll_earlier_after):
        raise PlasticError("earlier-context NLLs before and after must pair up")
    gain = nll_current_before - nll_current_after
    drops = [(a - b) / b for b, a in zip(nll_earlier_before, nll_earlier_after) if b > 0]
    forgetting = sum(drops) / len(drops) if drops else 0.0
    return Reward(gain, forgetting, gain - lam * forgetting)


@torch.no_grad()
def context_nll(model, windows: torch.Tensor) -> float:
    """Mean next-token NLL (nats/token) on ``windows`` = stack(ids [N, T], labels [N, T])."""
    return float(lm_loss(model, windows))


def earlier_contexts(contexts: Sequence[Context], t: int, n: int, source: str = "recent",
                     seed: int | str = 0) -> list[Context]:
    """The earlier contexts whose forgetting context ``t``'s reward measures: the last ``n``
    (``source="recent"``) or ``n`` drawn from all of ``contexts[:t]`` (``"all"``), in stream
    order, the same draw for the same ``(seed, t)``."""
    if source == "recent":
        return list(contexts[max(0, t - n): t])
    if source not in FORGET_FROM:
        raise PlasticError(f"forget_from must be one of {FORGET_FROM}, not {source!r}")
    picks = random.Random(f"{seed}:{t}").sample(range(t), min(n, t))
    return [contexts[i] for i in sorted(picks)]


REWARDS: Registry[type[RewardProbe]] = Registry("SCoL reward")


class RewardProbe:
    """A reward of context ``t``'s candidates: what it needs is measured on the running model
    before the commit (construction), then each adapted candidate is scored (a call). The
    registered subclasses are the rewards; :func:`reward_probe` builds the one ``cfg.reward``
    names."""

    def __init__(self, model, tokenizer, contexts: Sequence[Context], t: int, cfg):
        self.tokenizer, self.cfg, self.context = tokenizer, cfg, contexts[t]
        # one draw per stream (named by its first context) and position
        self.earlier = earlier_contexts(contexts, t, cfg.forget_window, cfg.forget_from,
                                        f"{cfg.seed}:{contexts[0].id}")
        self.windows = context_windows(tokenizer, self.context.text, cfg.lora.max_tokens)

    def __call__(self, adapted) -> Reward:
        raise NotImplementedError


@REWARDS.register("supervised")
class SupervisedReward(RewardProbe):
    """QA score (``cfg.qa_metric``) on the context's questions minus lambda times the score's
    drop on the earlier contexts' questions: needs questions."""

    def __init__(self, model, tokenizer, contexts: Sequence[Context], t: int, cfg):
        super().__init__(model, tokenizer, contexts, t, cfg)
        if not self.context.questions:
            raise PlasticError(f"context {self.context.id!r} has no questions; the "
                               "supervised reward needs them (use reward=intrinsic)")
        self.earlier_q = [q for c in self.earlier for q in c.questions]
        self.before = (qa_accuracy(model, tokenizer, self.earlier_q, cfg.qa_metric)
                       if self.earlier_q else None)

    def __call__(self, adapted) -> Reward:
        cfg = self.cfg
        acc = qa_accuracy(adapted, self.tokenizer, self.context.questions, cfg.qa_metric)
        after = (qa_accuracy(adapted, self.tokenizer, self.earlier_q, cfg.qa_metric)
                 if self.earlier_q else None)
        return supervised_reward(acc, self.before, after, cfg.lam)


@REWARDS.register("loglik")
class LoglikReward(RewardProbe):
    """The gold answers' log-likelihood gain on the context's questions minus lambda times
    its loss on the earlier contexts' questions (retention probes): needs questions, and
    separates candidates that 0/1 accuracy ties."""

    def __init__(self, model, tokenizer, contexts: Sequence[Context], t: int, cfg):
        super().__init__(model, tokenizer, contexts, t, cfg)
        if not self.context.questions:
            raise PlasticError(f"context {self.context.id!r} has no questions; the loglik "
                               "reward needs them (use reward=intrinsic)")
        self.earlier_q = [q for c in self.earlier for q in c.questions]
        self.current_before = answer_loglik(model, tokenizer, self.context.questions)
        self.earlier_before = answer_loglik(model, tokenizer, self.earlier_q)

    def __call__(self, adapted) -> Reward:
        return loglik_reward(self.current_before,
                             answer_loglik(adapted, self.tokenizer, self.context.questions),
                             self.earlier_before,
                             answer_loglik(adapted, self.tokenizer, self.earlier_q),
                             self.cfg.lam)


@REWARDS.register("intrinsic")
class IntrinsicReward(RewardProbe):
    """Likelihood gain on the context's text minus lambda times the normalised likelihood
    drop on the earlier contexts' texts: needs no questions."""

    def __init__(self, model, tokenizer, contexts: Sequence[Context], t: int, cfg):
        super().__init__(model, tokenizer, contexts, t, cfg)
        self.earlier_w = [context_windows(tokenizer, c.text, cfg.lora.max_tokens)
                          for c in self.earlier]
        self.cur_before = context_nll(model, self.windows)
        self.before_list = [context_nll(model, w) for w in self.earlier_w]

    def __call__(self, adapted) -> Reward:
        return intrinsic_reward(self.cur_before, context_nll(adapted, self.windows),
                                self.before_list,
                                [context_nll(adapted, w) for w in self.earlier_w], self.cfg.lam)


def reward_probe(model, tokenizer, contexts: Sequence[Context], t: int, cfg) -> RewardProbe:
    """The reward ``cfg.reward`` names, measured before context ``t``'s commit."""
    return REWARDS[cfg.reward](model, tokenizer, contexts, t, cfg)
