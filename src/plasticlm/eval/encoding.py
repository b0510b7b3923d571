"""Prompt encoding with exactly one BOS, prompt/continuation splits and batch padding."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from plasticlm.errors import PlasticError


def encode_with_bos(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` with exactly one BOS first when the tokenizer has one.

    Tokenizers from ``train_bpe_tokenizer`` add no BOS and llama2.c ones add it themselves;
    encoding without special tokens and prepending BOS here treats both alike.
    """
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    bos = tokenizer.bos_token_id
    if bos is None:
        return ids
    start = 0
    while start < len(ids) and ids[start] == bos:
        start += 1
    return [bos, *ids[start:]]


def encode_pair(tokenizer, prompt: str, continuation: str) -> tuple[list[int], list[int]]:
    """``(context_ids, continuation_ids)`` of ``prompt + continuation`` encoded as one text.

    Encoding the whole text and cutting at the longest prefix shared with the encoded prompt
    keeps the tokens the model would really see (a separately encoded " A" can differ, e.g.
    sentencepiece-style tokenizers prepend a space). A token merged across the boundary is
    counted with the continuation.
    """
    full = encode_with_bos(tokenizer, prompt + continuation)
    ctx = encode_with_bos(tokenizer, prompt)
    cut = 0
    for a, b in zip(full, ctx):
        if a != b:
            break
        cut += 1
    if cut == len(full):
        raise PlasticError(
            f"continuation {continuation!r} adds no tokens to the prompt; give a non-empty "
            "continuation to score"
        )
    if cut == 0:
        raise PlasticError(
            "the prompt encodes to no tokens and the tokenizer has no BOS: there is nothing to "
            "condition the first continuation token on; give a non-empty prompt"
        )
    return full[:cut], full[cut:]


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "right"
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad id lists to ``input_ids`` [B, T] and ``attention_mask`` [B, T] (1 = real token)."""
    if side not in ("left", "right"):
        raise PlasticError(f"padding side must be 'left' or 'right', not {side!r}")
    if not seqs or any(len(s) == 0 for s in seqs):
        raise PlasticError("cannot pad an empty batch or an empty sequence; drop empty texts first")
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        sl = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, sl] = torch.as_tensor(list(s), dtype=torch.long)
        mask[i, sl] = 1
    return ids, mask


def pad_id_of(tokenizer) -> int:
    """The id used for padding: pad, else EOS, else 0 (padded positions are masked anyway)."""
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    return 0
