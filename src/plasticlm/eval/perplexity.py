"""Token-weighted cross-entropy and perplexity of a causal LM on texts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tqdm.auto import tqdm

from plasticlm.errors import PlasticError
from plasticlm.eval.encoding import encode_with_bos, pad_batch, pad_id_of
from plasticlm.eval.scoring import next_token_logprobs


@dataclass
class Perplexity:
    """Mean next-token cross-entropy (nats/token) over ``num_tokens`` predicted tokens."""

    nll: float
    num_tokens: int

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)


def windows(ids: Sequence[int], max_length: int) -> list[list[int]]:
    """Cut ``ids`` into windows of at most ``max_length`` overlapping by one token.

    Each token after the first is then predicted exactly once, with the context of its own
    window only.
    """
    if max_length < 2:
        raise PlasticError(f"max_length must be >= 2 to predict anything, not {max_length}")
    ids = list(ids)
    step = max_length - 1
    return [ids[i : i + max_length] for i in range(0, max(len(ids) - 1, 1), step)]


def perplexity(model, tokenizer, texts: Sequence[str], max_length: int = 512,
               batch_size: int = 8, progress: bool = False) -> Perplexity:
    """Perplexity of ``model`` on ``texts``, each encoded with one BOS first (if any).

    Every text token is predicted once; texts longer than ``max_length`` are scored in
    consecutive windows (see :func:`windows`).
    """
    pieces = []
    for text in texts:
        ids = encode_with_bos(tokenizer, text)
        pieces.extend(w for w in windows(ids, max_length) if len(w) >= 2)
    if not pieces:
        raise PlasticError("no text has two or more tokens; nothing to predict")
    pieces.sort(key=len, reverse=True)
    pad = pad_id_of(tokenizer)
    total, count = 0.0, 0
    for i in tqdm(range(0, len(pieces), batch_size), desc="perplexity", disable=not progress):
        ids, mask = pad_batch(pieces[i : i + batch_size], pad)
        logp, _ = next_token_logprobs(model, ids, mask)
        total -= float(logp.double().sum())
        count += int(mask[:, 1:].sum())
    return Perplexity(total / count, count)
