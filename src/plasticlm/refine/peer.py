"""What modes, experiments and fuser training share: a device's model (:class:`Peer`) and how
it is loaded, how a prompt and an answer become its token ids, and the transmitter's draft."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from plasticlm.errors import PlasticError
from plasticlm.eval import encode_with_bos
from plasticlm.models import load_causal_lm
from plasticlm.refine.cache import KVLayout, kv_layout
from plasticlm.sandbox import resolve_model_spec


@dataclass
class Peer:
    """One device's LLM."""

    name: str
    model: object
    tokenizer: object

    @property
    def layout(self) -> KVLayout:
        return kv_layout(self.model)


def prompt_ids(tokenizer, text: str) -> list[int]:
    """``text`` as token ids with one BOS; a prompt needs two tokens (a cache and a query)."""
    ids = encode_with_bos(tokenizer, text)
    if len(ids) < 2:
        raise PlasticError(f"prompt {text!r} is too short: it needs at least two tokens")
    return ids


def as_batch(ids: list[int]) -> torch.Tensor:
    """One sequence of ids as a batch-1 tensor [1, T]."""
    return torch.tensor([ids], dtype=torch.long)


def continuation_ids(tokenizer, prompt: list[int], prompt_text: str, piece: str) -> list[int]:
    """Token ids that ``piece`` adds after ``prompt_text`` (encoded as ``prompt``) when both
    are encoded as one text; the piece alone when the tokenizer merges across the boundary."""
    full = encode_with_bos(tokenizer, prompt_text + piece)
    if full[: len(prompt)] == prompt and len(full) > len(prompt):
        return full[len(prompt):]
    ids = list(tokenizer(piece, add_special_tokens=False)["input_ids"])
    if not ids:
        raise PlasticError(f"answer choice {piece!r} encodes to no tokens")
    return ids


@torch.no_grad()
def transmitter_ids(peer: Peer, text: str, draft_tokens: int = 0) -> list[int]:
    """The transmitter's tokens of ``text`` (one BOS), followed by up to ``draft_tokens``
    greedy tokens of its own (stopping at EOS)."""
    ids = prompt_ids(peer.tokenizer, text)
    if draft_tokens <= 0:
        return ids
    device = next(peer.model.parameters()).device
    pad = peer.tokenizer.pad_token_id
    out = peer.model.generate(input_ids=as_batch(ids).to(device), max_new_tokens=draft_tokens,
                              do_sample=False, pad_token_id=pad if pad is not None else 0,
                              eos_token_id=peer.tokenizer.eos_token_id)
    new = out[0, len(ids):].tolist()
    eos = peer.tokenizer.eos_token_id
    return ids + (new[: new.index(eos)] if eos in new else new)


def resolve_model(spec: str) -> tuple[str, Path | str]:
    """(display name, folder or hub id) of ``sandbox:NAME`` / ``quick:NAME`` (pre-trained
    sandbox models) or a path / hub id."""
    name = spec.partition(":")[2]
    resolved = resolve_model_spec(spec)
    return (name, Path(resolved)) if resolved != spec else (Path(spec).name or spec, spec)


def load_peer(spec: str, dtype=None) -> Peer:
    """The :class:`Peer` of a model spec (``sandbox:NAME``, a folder or a hub id), on the
    run's device and in its dtype (``dtype`` overrides the latter)."""
    name, path = resolve_model(spec)
    model, tok = load_causal_lm(path, dtype=dtype)
    return Peer(name, model, tok)
