"""The receiver's prepared state for one prompt, and what is read from it: summed log-probs of
answer choices, or a greedy continuation."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from plasticlm.eval import cut_at_stop, mask_undecodable, pad_batch, pad_id_of, qa_continuation
from plasticlm.refine.cache import KVCache, build_dynamic_cache, continue_from_cache
from plasticlm.refine.peer import as_batch, continuation_ids


@dataclass
class Prepared:
    """The receiver's state for one prompt, ready to score from or decode from."""

    cache: KVCache
    tail: list[int]                # receiver tokens to run on the cache (their last predicts)
    prompt_ids: list[int]
    wire_bytes: int = 0
    background: list[str] = field(default_factory=list)
    rephrased: list[str] = field(default_factory=list)
    start: int | None = None       # position of tail[0] (None: right after the cache)
    seconds: dict[str, float] = field(default_factory=dict)   # time per step so far


def start_positions(prep: Prepared, batch: int = 1) -> torch.Tensor | None:
    return None if prep.start is None else torch.full((batch,), prep.start)


def argmax(xs: list[float]) -> int:
    return max(range(len(xs)), key=xs.__getitem__)


def score_choices(model, tokenizer, prep: Prepared, prompt: str, choices: list[str]
                  ) -> list[float]:
    """Summed log-prob of `` <choice>`` for each choice, all in one batch on ``prep``'s state."""
    conts = [continuation_ids(tokenizer, prep.prompt_ids, prompt, qa_continuation(c.strip()))
             for c in choices]
    ids, mask = pad_batch([prep.tail + c for c in conts], pad_id_of(tokenizer))
    logits = continue_from_cache(model, prep.cache.expand(len(conts)), ids, mask,
                                 start_positions=start_positions(prep, len(conts))).float()
    logp = logits.log_softmax(-1)
    out = []
    n = len(prep.tail)
    for i, c in enumerate(conts):
        rows = logp[i, n - 1: n - 1 + len(c)]
        out.append(float(rows.gather(-1, torch.tensor(c)[:, None].to(rows.device)).sum()))
    return out


def greedy_decode(model, tokenizer, prep: Prepared, max_new_tokens: int,
                  stop: tuple[str, ...] = ()) -> tuple[str, float]:
    """Greedy continuation after ``prep``; returns ``(text, perf_counter time of token 1)``.
    Each step computes the last position's logits [1, V] only, and picks among the ids the
    tokenizer decodes."""
    device = next(model.parameters()).device
    cache = build_dynamic_cache(prep.cache.keys, prep.cache.values)
    mask = prep.cache.mask.to(device)
    pos = int(prep.cache.mask.sum()) if prep.start is None else prep.start
    ids = as_batch(prep.tail).to(device)
    new: list[int] = []
    first = None
    eos = tokenizer.eos_token_id
    for _ in range(max_new_tokens):
        mask = torch.cat([mask, torch.ones_like(ids)], 1)
        positions = torch.arange(pos, pos + ids.shape[1], device=device)[None]
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                    use_cache=True, logits_to_keep=1)
        cache = out.cache
        pos += ids.shape[1]
        nxt = int(mask_undecodable(out.logits[0, -1], tokenizer).argmax())
        first = first or time.perf_counter()
        if nxt == eos:
            break
        new.append(nxt)
        text = tokenizer.decode(new, skip_special_tokens=True)
        if any(s in text for s in stop):
            break
        ids = torch.tensor([[nxt]], device=device)
    text = cut_at_stop(tokenizer.decode(new, skip_special_tokens=True), stop)
    return text, first or time.perf_counter()
