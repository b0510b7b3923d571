"""What the policy assigns to one action: the log-probability of a completion and its entropy
under the action grammar, with the LM head run at the completion's positions only. IPO
(:mod:`plasticlm.scol.ipo`) trains on these."""

from __future__ import annotations

import torch

from plasticlm.errors import PlasticError
from plasticlm.scol.policy import LayerGrammar


def completion_logprob(model, prompt_ids: list[int], completion_ids: list[int],
                       grammar: LayerGrammar | None = None) -> torch.Tensor:
    """Log-prob (differentiable scalar) of ``completion_ids`` after ``prompt_ids``: the sum
    over its tokens; with ``grammar``, under the grammar-masked (renormalised) distribution
    and over the free tokens only (a token the grammar forces has probability 1, and adds
    nothing that the policy chose). Logits [C, V] are computed at the C completion positions
    only."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + completion_ids], device=device)
    logits = _completion_logits(model, ids, len(completion_ids))
    target = ids[0, len(prompt_ids):]
    if grammar is None:
        return logits.log_softmax(-1).gather(-1, target[:, None]).sum()
    grammar.check_width(logits)
    masks = torch.stack(grammar.masks_for(completion_ids)).to(device)
    if masks.shape[0] != len(completion_ids):
        raise PlasticError("the completion leaves the action grammar before its last token")
    logp = logits.masked_fill(~masks, float("-inf")).log_softmax(-1)
    chosen = logp.gather(-1, target[:, None]).squeeze(-1)
    free = masks.sum(-1) > 1
    return (chosen * free).sum()


def candidate_logprobs(model, prompt_ids: list[int], completions: list[list[int]],
                       grammar: LayerGrammar) -> torch.Tensor:
    """Log-probs [C] (differentiable) of C completions after one prompt, as
    :func:`completion_logprob` gives each, in one batch [C, T]: rows are padded on the right
    with the end token, which a causal model never attends to from the scored positions."""
    if not completions:
        raise PlasticError("no completions to score")
    device = next(model.parameters()).device
    longest = max(map(len, completions))
    rows = [prompt_ids + c + [grammar.end_id] * (longest - len(c)) for c in completions]
    ids = torch.tensor(rows, device=device)
    out = model(input_ids=ids, logits_to_keep=longest + 1).logits[:, :-1].float()  # [C, L, V]
    grammar.check_width(out)
    logps = []
    for r, c in enumerate(completions):
        masks = torch.stack(grammar.masks_for(c)).to(device)                       # [n, V]
        if masks.shape[0] != len(c):
            raise PlasticError("a completion leaves the action grammar before its last token")
        logits = out[r, : len(c)]
        logp = logits.masked_fill(~masks, float("-inf")).log_softmax(-1)
        chosen = logp.gather(-1, torch.tensor(c, device=device)[:, None]).squeeze(-1)
        logps.append((chosen * (masks.sum(-1) > 1)).sum())
    return torch.stack(logps)


def constrained_entropy(model, prompt_ids: list[int], completion_ids: list[int],
                        grammar: LayerGrammar) -> torch.Tensor:
    """Mean entropy of the policy restricted to the grammar's allowed tokens at each step
    of a completion (differentiable scalar): the diversity term against mode collapse."""
    device = next(model.parameters()).device
    masks = grammar.masks_for(completion_ids)
    ids = torch.tensor([prompt_ids + completion_ids], device=device)
    logits = _completion_logits(model, ids, len(completion_ids))[: len(masks)]
    grammar.check_width(logits)
    mask = torch.stack(masks).to(device)
    logp = logits.masked_fill(~mask, float("-inf")).log_softmax(-1)
    ent = -(logp.exp() * logp.masked_fill(~mask, 0.0)).sum(-1)
    return ent.mean()


def _completion_logits(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    """Float logits [n, V] that predict the last ``n`` tokens of ``ids`` [1, T] (the LM head
    runs on those positions only, never on the whole prompt)."""
    return model(input_ids=ids, logits_to_keep=n + 1).logits[0, :-1].float()
