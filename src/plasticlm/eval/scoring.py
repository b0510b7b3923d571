"""Log-probabilities of token sequences under a causal LM, batched with attention masks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from plasticlm.errors import PlasticError
from plasticlm.eval.encoding import pad_batch
from plasticlm.eval.lm_head import hidden_states, selected_logits, token_logprobs


def model_device(model) -> torch.device:
    """The device of the model's first parameter."""
    return next(model.parameters()).device


@torch.no_grad()
def next_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        scored: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each next token and whether it is the argmax, both [B, T-1].

    ``input_ids``/``attention_mask`` [B, T] may be padded on either side. Position ids come
    from the mask: HF models otherwise count left padding as positions, which RoPE forgives
    (it sees only offsets) but absolute or length-limited position schemes do not.
    Entries whose target is padding are 0 / False, and so are those outside ``scored``
    (bool [B, T-1], default all): the LM head runs at the scored positions only
    (:mod:`plasticlm.eval.lm_head`), a chunk of them at a time.
    """
    device = model_device(model)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    hidden = hidden_states(model, input_ids, attention_mask, position_ids)[:, :-1]
    target = input_ids[:, 1:]
    real = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    if scored is not None:
        real = real & scored.to(device)
    logp = torch.zeros(real.shape, dtype=torch.float32, device=device)
    greedy = torch.zeros(real.shape, dtype=torch.bool, device=device)
    logp[real], greedy[real] = token_logprobs(model, hidden[real], target[real])
    return logp, greedy


@torch.no_grad()
def last_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor
                        ) -> torch.Tensor:
    """Log-distribution [B, V] of the token after each row's last real token of [B, T]."""
    device = model_device(model)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    last = attention_mask.shape[1] - 1 - attention_mask.flip(-1).argmax(-1)  # last 1 per row
    hidden = hidden_states(model, input_ids, attention_mask, position_ids)
    rows = torch.arange(len(last), device=device)
    return selected_logits(model, hidden[rows, last]).log_softmax(-1)


@dataclass
class ContinuationScore:
    """Total log-prob of a continuation given its context, its length and greediness."""

    logprob: float
    num_tokens: int
    greedy: bool  # every continuation token is the model's argmax

    @property
    def mean_logprob(self) -> float:
        return self.logprob / self.num_tokens


def score_continuations(model, contexts: Sequence[Sequence[int]],
                        continuations: Sequence[Sequence[int]], pad_id: int = 0,
                        batch_size: int = 8, padding_side: str = "right",
                        ) -> list[ContinuationScore]:
    """Score ``log p(continuation | context)`` for each pair of id lists.

    Pairs are batched longest first to waste little padding; results keep the input order.
    One-token continuations sharing a context are read from a single forward pass.
    """
    if len(contexts) != len(continuations):
        raise PlasticError(f"{len(contexts)} contexts but {len(continuations)} continuations")
    if batch_size < 1:
        raise PlasticError(f"batch_size must be >= 1, not {batch_size}")
    for ctx, cont in zip(contexts, continuations):
        if not ctx or not cont:
            raise PlasticError("each context and continuation needs at least one token")
    out: list[ContinuationScore | None] = [None] * len(contexts)
    # One-token continuations of a shared context (answer letters) need one forward pass
    # for the whole group instead of one per continuation.
    shared: dict[tuple[int, ...], list[int]] = {}
    for i, cont in enumerate(continuations):
        if len(cont) == 1:
            shared.setdefault(tuple(contexts[i]), []).append(i)
    groups = [(list(ctx), idx) for ctx, idx in shared.items() if len(idx) > 1]
    grouped = {i for _, idx in groups for i in idx}
    groups.sort(key=lambda g: -len(g[0]))
    for start in range(0, len(groups), batch_size):
        batch = groups[start : start + batch_size]
        ids, mask = pad_batch([ctx for ctx, _ in batch], pad_id, padding_side)
        logp = last_token_logprobs(model, ids, mask)
        for row, (_, idx) in enumerate(batch):
            best = int(logp[row].argmax())
            for i in idx:
                tok = int(continuations[i][0])
                out[i] = ContinuationScore(float(logp[row, tok]), 1, tok == best)

    order = sorted((i for i in range(len(contexts)) if i not in grouped),
                   key=lambda i: -(len(contexts[i]) + len(continuations[i])))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        seqs = [list(contexts[i]) + list(continuations[i]) for i in idx]
        ids, mask = pad_batch(seqs, pad_id, padding_side)
        width = ids.shape[1]
        spans = []
        scored = torch.zeros(len(idx), width - 1, dtype=torch.bool)
        for row, i in enumerate(idx):
            n_cont, total = len(continuations[i]), len(seqs[row])
            end = width - 1 if padding_side == "left" else total - 1
            spans.append(slice(end - n_cont, end))  # targets shifted by one: j predicts j+1
            scored[row, spans[-1]] = True
        logp, greedy = next_token_logprobs(model, ids, mask, scored)
        for row, i in enumerate(idx):
            n_cont, span = len(continuations[i]), spans[row]
            out[i] = ContinuationScore(float(logp[row, span].sum()), n_cont,
                                       bool(greedy[row, span].all()))
    return out  # type: ignore[return-value]
