"""One vocabulary rule: tensors over the vocabulary are as wide as the logits; generation never
emits an id the tokenizer cannot decode.

A checkpoint's logits are often wider than its tokenizer (``config.vocab_size`` is padded:
151,936 logits for Qwen2.5 and Qwen3, whose tokenizers hold about 151,665 entries). Masks,
grammars, scores and samples are therefore sized by :func:`logits_width`, and before any
argmax or sample the ids from ``len(tokenizer)`` up are set to -inf
(:func:`mask_undecodable`, or :func:`decodable_only` for ``model.generate``).
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList


def logits_width(model) -> int:
    """V, the width of the model's logits: the rows of its output embedding (the LM head),
    else ``config.vocab_size``."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if weight is not None:
        return int(weight.shape[0])
    return int(model.config.vocab_size)


def decodable_count(tokenizer) -> int:
    """How many ids the tokenizer decodes: ids ``0 .. len(tokenizer) - 1``."""
    return len(tokenizer)


def decodable_mask(model, tokenizer) -> torch.Tensor:
    """Bool [V] (V = :func:`logits_width`), True on the ids the tokenizer can decode."""
    mask = torch.zeros(logits_width(model), dtype=torch.bool)
    mask[: decodable_count(tokenizer)] = True
    return mask


def mask_undecodable(logits: torch.Tensor, tokenizer) -> torch.Tensor:
    """``logits`` [..., V] with the ids the tokenizer cannot decode (``>= len(tokenizer)``) at
    -inf, ready for argmax or sampling; a new tensor (the input is left as it is)."""
    n = decodable_count(tokenizer)
    if logits.shape[-1] <= n:
        return logits
    out = logits.clone()
    out[..., n:] = float("-inf")
    return out


class DecodableOnly(LogitsProcessor):
    """A ``model.generate`` logits processor: scores [B, V] with the ids from ``count`` up at
    -inf, so that greedy search and sampling only pick decodable ids."""

    def __init__(self, count: int):
        self.count = count

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if scores.shape[-1] > self.count:
            scores = scores.clone()
            scores[:, self.count:] = float("-inf")
        return scores


def decodable_only(tokenizer) -> LogitsProcessorList:
    """The ``logits_processor`` argument of ``model.generate`` that applies the rule."""
    return LogitsProcessorList([DecodableOnly(decodable_count(tokenizer))])
