"""Greedy generation from text prompts, batched with left padding; only ids the tokenizer
decodes are generated (:mod:`plasticlm.eval.vocab`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from plasticlm.errors import PlasticError
from plasticlm.eval.encoding import encode_with_bos, pad_batch, pad_id_of
from plasticlm.eval.scoring import model_device
from plasticlm.eval.vocab import decodable_only


@torch.no_grad()
def generate_texts(model, tokenizer, prompts: Sequence[str], max_new_tokens: int = 32,
                   batch_size: int = 8, stop: Sequence[str] = (), progress: bool = False,
                   use_cache: bool = True) -> list[str]:
    """Greedy continuations of ``prompts`` (each encoded with one BOS), cut at any ``stop``.

    Prompts are left-padded so that every row's new tokens start at the same column.
    ``use_cache=False`` reruns the whole sequence per token, for models whose extra state
    (e.g. a memory) a KV cache does not carry.
    """
    if max_new_tokens < 1:
        raise PlasticError(f"max_new_tokens must be >= 1, not {max_new_tokens}")
    encoded = [encode_with_bos(tokenizer, p) for p in prompts]
    pad = pad_id_of(tokenizer)
    eos = tokenizer.eos_token_id
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    texts: list[str] = [""] * len(encoded)
    device = model_device(model)
    decodable = decodable_only(tokenizer)
    for start in tqdm(range(0, len(order), batch_size), desc="generate", disable=not progress):
        idx = order[start : start + batch_size]
        ids, mask = pad_batch([encoded[i] for i in idx], pad, side="left")
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                             max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=pad, eos_token_id=eos, use_cache=use_cache,
                             logits_processor=decodable)
        for row, i in enumerate(idx):
            new = out[row, ids.shape[1]:].tolist()
            if eos is not None and eos in new:
                new = new[: new.index(eos)]
            texts[i] = cut_at_stop(tokenizer.decode(new, skip_special_tokens=True), stop)
    return texts


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to the earliest occurrence of any stop string."""
    cuts = [text.find(s) for s in stop if s and s in text]
    return text[: min(cuts)] if cuts else text
