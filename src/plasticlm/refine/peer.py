"""What modes, experiments and fuser training share: a device's model (:class:`Peer`) and how
it is loaded, how a prompt and an answer become its token ids, and the transmitter's draft."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from plasticlm.errors import PlasticError
from plasticlm.eval import decodable_only, encode_with_bos, generate_texts
from plasticlm.models import load_causal_lm
from plasticlm.models.specs import resolve_model as resolve_model_folder
from plasticlm.refine.cache import KVCache, KVLayout, extract_cache, kv_layout
from plasticlm.refine.fusers.align import token_ends


@dataclass
class Transmission:
    """What a transmitter sends for one text: its cache (batch 1; layers not sent are empty),
    the end character of each token in the text (BOS: 0) for aligning with the receiver's
    tokens, how many tokens the prompt had before any drafted ones, and the bytes it took."""

    cache: KVCache
    token_ends: list[int]
    prompt_tokens: int
    layers: list[int]
    text_sha256: str = ""
    wire_bytes: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    first: int = 0              # positions of the text not sent (share="draft")

    @property
    def has_bos(self) -> bool:
        # a real token ends after at least one character; only BOS ends at 0
        return bool(self.token_ends) and self.token_ends[0] == 0


def text_digest(text: str) -> str:
    """SHA-256 of a prompt, so a receiver can check a cache was made for its prompt."""
    return hashlib.sha256(text.encode()).hexdigest()


class Transmitter(Protocol):
    """What a receiver needs of a transmitter, here or across the network."""

    name: str

    @property
    def layout(self) -> KVLayout: ...

    def prefill(self, text: str, draft_tokens: int = 0, layers: list[int] | None = None,
                share: str = "all") -> Transmission: ...

    def generate(self, text: str, max_new_tokens: int, stop: tuple[str, ...] = ("\n",)
                 ) -> str: ...


@dataclass
class Peer:
    """One device's LLM, in this process (a transmitter elsewhere is a ``RemotePeer`` with
    the same ``prefill``/``generate``)."""

    name: str
    model: object
    tokenizer: object

    @property
    def layout(self) -> KVLayout:
        return kv_layout(self.model)

    @torch.no_grad()
    def prefill(self, text: str, draft_tokens: int = 0, layers: list[int] | None = None,
                share: str = "all") -> Transmission:
        """This model's cache of ``text`` (one BOS; then up to ``draft_tokens`` greedy tokens
        of its own), sending ``layers`` (default all). ``share="draft"`` sends only the
        drafted positions (the last prompt position when nothing was drafted), so the
        prompt's cache never leaves the device."""
        t0 = time.perf_counter()
        ids, ends = token_ends(self.tokenizer, text)
        prompt_tokens = len(ids)
        if draft_tokens > 0:
            ids = with_draft(self, ids, draft_tokens)
            ends = ends + [len(text)] * (len(ids) - prompt_tokens)
        cache, _ = extract_cache(self.model, as_batch(ids), model_name=self.name)
        first = min(max(1, prompt_tokens), len(ids) - 1) if share == "draft" else 0
        if first:
            cache, ends = cache.drop_first(first), ends[first:]
        layers = list(range(cache.num_layers)) if layers is None else sorted(set(layers))
        return Transmission(cache, ends, prompt_tokens, layers, text_digest(text),
                            cache.wire_bytes(layers), {"prefill": time.perf_counter() - t0},
                            first)

    def generate(self, text: str, max_new_tokens: int, stop: tuple[str, ...] = ("\n",)) -> str:
        """Greedy text after ``text`` (the background a t2t transmitter sends)."""
        return generate_texts(self.model, self.tokenizer, [text], max_new_tokens, stop=stop)[0]


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
    return with_draft(peer, prompt_ids(peer.tokenizer, text), draft_tokens)


@torch.no_grad()
def with_draft(peer: Peer, ids: list[int], draft_tokens: int) -> list[int]:
    """``ids`` followed by up to ``draft_tokens`` greedy tokens of ``peer`` (stopping at EOS),
    all of them ids its tokenizer decodes."""
    if draft_tokens <= 0:
        return ids
    device = next(peer.model.parameters()).device
    pad = peer.tokenizer.pad_token_id
    out = peer.model.generate(input_ids=as_batch(ids).to(device), max_new_tokens=draft_tokens,
                              do_sample=False, pad_token_id=pad if pad is not None else 0,
                              eos_token_id=peer.tokenizer.eos_token_id,
                              logits_processor=decodable_only(peer.tokenizer))
    new = out[0, len(ids):].tolist()
    eos = peer.tokenizer.eos_token_id
    return ids + (new[: new.index(eos)] if eos in new else new)


def resolve_model(spec: str) -> tuple[str, Path | str]:
    """(display name, folder or hub id) of ``sandbox:NAME`` / ``quick:NAME`` (pre-trained
    sandbox models) or a path / hub id."""
    name = spec.partition(":")[2]
    resolved = resolve_model_folder(spec)
    return (name, Path(resolved)) if resolved != spec else (Path(spec).name or spec, spec)


def load_peer(spec: str, dtype=None) -> Peer:
    """The :class:`Peer` of a model spec (``sandbox:NAME``, a folder or a hub id), on the
    run's device and in its dtype (``dtype`` overrides the latter)."""
    name, path = resolve_model(spec)
    model, tok = load_causal_lm(path, dtype=dtype)
    return Peer(name, model, tok)
