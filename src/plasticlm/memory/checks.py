"""Padding checks for any decoder (memory attached or not): what left padding changes."""

from __future__ import annotations

import torch


@torch.no_grad()
def left_padding_gap(model, seqs: list[torch.Tensor], pad_id: int = 7) -> float:
    """Largest |padded - alone| over each row's real-token hidden states and its last
    position's logits (the LM head applied there only), for the 1D id tensors ``seqs``
    left-padded into one batch against each run alone. 0 up to rounding when padding is
    handled; NaN or inf anywhere gives inf."""
    t = max(len(s) for s in seqs)
    batch = torch.stack([torch.cat([torch.full((t - len(s),), pad_id), s]) for s in seqs])
    mask = torch.stack([torch.cat([torch.zeros(t - len(s)), torch.ones(len(s))])
                        for s in seqs]).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    hidden = decoder(batch, attention_mask=mask, position_ids=positions).last_hidden_state
    if not torch.isfinite(hidden).all():
        return float("inf")
    gap = 0.0
    for row, seq in enumerate(seqs):
        alone = decoder(seq[None]).last_hidden_state[0]
        padded = hidden[row, -len(seq):]
        logits = head(torch.stack([padded[-1], alone[-1]])).float()
        gap = max(gap, (padded - alone).abs().max().item(),
                  (logits[0] - logits[1]).abs().max().item())
    return gap
