"""Streaming cross-entropy: mean loss per position bucket of long token streams.

FedNL's curve: the mean CE of each bucket of positions, divided by the first bucket's, so
that a model which uses the unfolding context shows a falling curve. The losses come from
any callable ``ids [T] -> losses [T-1]``, so a streaming memory model can supply its own,
computed chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from plasticlm.errors import PlasticError
from plasticlm.eval.scoring import model_device

TokenLosses = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class StreamingCE:
    """Per-bucket mean CE and the same divided by the first bucket's."""

    bucket_size: int
    bucket_starts: list[int]  # position of the first predicted token of each bucket
    mean_ce: list[float]
    normalised: list[float]
    num_streams: list[int]  # streams long enough to fill each bucket

    @property
    def relative_change(self) -> float:
        """Last bucket's CE relative to the first (FedNL: +3.1% FedAvg, -2.1% FedNL)."""
        return self.normalised[-1] - 1.0


def bucket_means(losses: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """Mean of each full bucket of ``bucket_size`` consecutive losses: [T] -> [T // bucket_size].

    A trailing partial bucket is dropped so that every bucket averages the same count.
    """
    if bucket_size < 1:
        raise PlasticError(f"bucket_size must be >= 1, not {bucket_size}")
    n = losses.shape[-1] // bucket_size
    return losses[: n * bucket_size].double().view(n, bucket_size).mean(-1)


def streaming_ce_from_losses(losses: Sequence[torch.Tensor], bucket_size: int) -> StreamingCE:
    """Streaming CE from per-token losses of each stream (1-D tensors, any lengths).

    Bucket b averages, over the streams that fill it, each stream's mean loss in the bucket.
    """
    means = [bucket_means(torch.as_tensor(x).flatten(), bucket_size) for x in losses]
    num_buckets = max((len(m) for m in means), default=0)
    if num_buckets == 0:
        raise PlasticError(
            f"no stream has {bucket_size} scored tokens; use longer streams or a smaller bucket_size")
    mean_ce, counts = [], []
    for b in range(num_buckets):
        vals = [float(m[b]) for m in means if len(m) > b]
        mean_ce.append(sum(vals) / len(vals))
        counts.append(len(vals))
    if not mean_ce[0] > 0:
        raise PlasticError(
            f"the first bucket's mean CE is {mean_ce[0]}; it must be positive to normalise by it")
    return StreamingCE(bucket_size, [1 + b * bucket_size for b in range(num_buckets)], mean_ce,
                       [c / mean_ce[0] for c in mean_ce], counts)


def streaming_ce(token_losses: TokenLosses, streams: Sequence[Sequence[int] | torch.Tensor],
                 bucket_size: int) -> StreamingCE:
    """Streaming CE of ``token_losses`` (ids [T] -> losses [T-1]) over token ``streams``."""
    losses = []
    for s in streams:
        ids = torch.as_tensor(s, dtype=torch.long).flatten()
        out = torch.as_tensor(token_losses(ids)).detach().flatten().cpu()
        if out.numel() != ids.numel() - 1:
            raise PlasticError(
                f"token_losses returned {out.numel()} losses for {ids.numel()} ids; it must "
                "return one loss per predicted token (T - 1)")
        losses.append(out)
    return streaming_ce_from_losses(losses, bucket_size)


def chunked_token_losses(model, chunk_size: int | None = None) -> TokenLosses:
    """A ``TokenLosses`` for an HF causal LM fed ``chunk_size`` tokens at a time.

    The KV cache carries over between chunks, so the result equals one full forward pass;
    ``chunk_size=None`` runs the whole stream at once. Positions are not limited to the
    model's trained length: a base model past its window shows rising CE.
    """
    if chunk_size is not None and chunk_size < 1:
        raise PlasticError(f"chunk_size must be >= 1, not {chunk_size}")

    @torch.no_grad()
    def losses(ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(model_device(model)).flatten()
        step = chunk_size or ids.numel()
        cache, out, prev_last = None, [], None
        for start in range(0, ids.numel(), step):
            chunk = ids[start : start + step]
            res = model(input_ids=chunk[None], cache=cache, use_cache=True)
            cache = res.cache
            logits = res.logits[0].float()
            if prev_last is not None:  # the previous chunk's last logit predicts this chunk's first
                logits = torch.cat([prev_last, logits])
                chunk = torch.cat([ids[start - 1 : start], chunk])
            out.append(F.cross_entropy(logits[:-1], chunk[1:], reduction="none"))
            prev_last = logits[-1:]
        return torch.cat(out).cpu()

    return losses
