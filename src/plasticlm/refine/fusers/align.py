"""Aligning two models' caches: which layer feeds which, RoPE undone and redone, which token
feeds which (the receiver's tokens are the reference)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from plasticlm.errors import PlasticError
from plasticlm.eval import encode_with_bos

LayerMap = Literal["last", "depth"]
LAYER_MAPS = get_args(LayerMap)


def layer_map(receiver_layers: int, transmitter_layers: int, strategy: str = "last") -> list[int]:
    """For each receiver layer, the transmitter layer it reads.

    ``last``: the last layers line up, receiver layer t reads transmitter layer
    ``(S - R) + t`` clamped to [0, S-1] (C2C's choice). ``depth``: by relative depth,
    ``round(t * (S-1) / (R-1))``.
    """
    if receiver_layers < 1 or transmitter_layers < 1:
        raise PlasticError("both models need at least one layer")
    if strategy == "last":
        off = transmitter_layers - receiver_layers
        return [min(max(off + t, 0), transmitter_layers - 1) for t in range(receiver_layers)]
    if strategy == "depth":
        if receiver_layers == 1:
            return [transmitter_layers - 1]
        return [round(t * (transmitter_layers - 1) / (receiver_layers - 1))
                for t in range(receiver_layers)]
    raise PlasticError(f"unknown layer map {strategy!r}; choose one of {', '.join(LAYER_MAPS)}")


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, scaling: float = 1.0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """HF-style (rotate-half) RoPE tables [B, 1, T, head_dim] for ``positions`` [B, T]."""
    freqs = positions[..., None].float() * inv_freq.to(positions.device)
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scaling)[:, None], (emb.sin() * scaling)[:, None]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def rotate(keys: torch.Tensor, inv_freq: torch.Tensor, positions: torch.Tensor,
           scaling: float = 1.0) -> torch.Tensor:
    """Apply RoPE at ``positions`` [B, T] to ``keys`` [B, H, T, D]."""
    cos, sin = rope_cos_sin(inv_freq, positions, scaling)
    return keys * cos.to(keys.dtype) + _rotate_half(keys) * sin.to(keys.dtype)


def derotate(keys: torch.Tensor, inv_freq: torch.Tensor, positions: torch.Tensor,
             scaling: float = 1.0) -> torch.Tensor:
    """Undo RoPE at ``positions`` [B, T] on ``keys`` [B, H, T, D] (rotation by minus angle).

    ``scaling`` (the attention factor of scaled RoPE types) multiplies both tables, so the
    inverse divides by its square.
    """
    cos, sin = rope_cos_sin(inv_freq, positions, 1.0)
    out = keys * cos.to(keys.dtype) - _rotate_half(keys) * sin.to(keys.dtype)
    return out / scaling if scaling != 1.0 else out


@dataclass
class TokenAlignment:
    """Receiver tokens as reference: ``index[i]`` is the transmitter position read at receiver
    position ``i``; ``transmitter_ids`` are the transmitter's own tokens of the same text."""

    receiver_ids: list[int]
    transmitter_ids: list[int]
    index: list[int]


def _offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]] | None:
    if not getattr(tokenizer, "is_fast", False):
        return None
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def _with_bos(tokenizer, ids: list[int]) -> tuple[list[int], int]:
    bos = tokenizer.bos_token_id
    return ([bos, *ids], 1) if bos is not None else (ids, 0)


def align_tokens(receiver_tokenizer, transmitter_tokenizer, text: str) -> TokenAlignment:
    """Encode ``text`` with both tokenizers (one BOS each) and map positions 1:1 onto the
    receiver's tokens.

    Each tokenizer encodes the text its own way, so the transmitter sees the tokens it was
    trained on. Receiver token ``i`` reads the transmitter token that covers the last
    character of token ``i`` (BOS reads BOS). Without character offsets (slow tokenizers),
    each receiver token is decoded and re-encoded by the transmitter keeping its first
    token, as C2C does; then the transmitter encodes that 1:1 sequence.
    """
    r = _offsets(receiver_tokenizer, text)
    t = _offsets(transmitter_tokenizer, text)
    if r is None or t is None:
        rids = encode_with_bos(receiver_tokenizer, text)
        tids = []
        for tok in rids:
            if tok == receiver_tokenizer.bos_token_id:
                tids.append(transmitter_tokenizer.bos_token_id or 0)
                continue
            piece = transmitter_tokenizer(receiver_tokenizer.decode([tok]),
                                          add_special_tokens=False)["input_ids"]
            tids.append(piece[0] if piece else transmitter_tokenizer.unk_token_id or 0)
        return TokenAlignment(rids, tids, list(range(len(rids))))
    (rids, roffs), (tids, toffs) = r, t
    if not rids or not tids:
        raise PlasticError(f"text {text!r} encodes to no tokens; give a non-empty prompt")
    rids, rshift = _with_bos(receiver_tokenizer, rids)
    tids, tshift = _with_bos(transmitter_tokenizer, tids)
    return TokenAlignment(rids, tids, _index([e for _, e in roffs], [e for _, e in toffs],
                                             rshift, tshift))


def _index(receiver_ends: list[int], transmitter_ends: list[int], rshift: int, tshift: int
           ) -> list[int]:
    index = [0] * rshift
    j = 0
    for end in receiver_ends:
        # First transmitter token whose span reaches the receiver token's last character.
        while j < len(transmitter_ends) - 1 and transmitter_ends[j] < end:
            j += 1
        index.append(j + tshift)
    return index


def token_ends(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """``text``'s token ids with one BOS and the end character of each token (BOS: 0): what a
    transmitter sends so that a receiver can align without its tokenizer."""
    enc = _offsets(tokenizer, text)
    if enc is not None:
        ids, ends = enc[0], [e for _, e in enc[1]]
    else:   # slow tokenizers: the length of the decoded prefix after each token
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        ends = [len(tokenizer.decode(ids[: i + 1])) for i in range(len(ids))]
    if not ids:
        raise PlasticError(f"text {text!r} encodes to no tokens; give a non-empty prompt")
    ids, shift = _with_bos(tokenizer, ids)
    return ids, [0] * shift + ends


def entity_positions(tokenizer, text: str, entity: str) -> list[int]:
    """Positions (in ``text``'s ids with one BOS) of the tokens that overlap the first
    occurrence of ``entity`` in ``text``: where a model reads the entity's name."""
    start = text.find(entity)
    if not entity or start < 0:
        raise PlasticError(f"entity {entity!r} does not occur in {text[:60]!r}")
    end = start + len(entity)
    _, ends = token_ends(tokenizer, text)
    out, begin = [], 0
    for i, e in enumerate(ends):
        if e > begin and e > start and begin < end:   # a token spanning [begin, e)
            out.append(i)
        begin = max(begin, e)
    return out


def align_to_ends(receiver_tokenizer, text: str, transmitter_ends: list[int],
                  transmitter_bos: bool) -> tuple[list[int], list[int]]:
    """Receiver ids of ``text`` (one BOS) and, for each, the position of a remote transmitter's
    token to read, from the end characters the transmitter sent (:func:`token_ends`)."""
    r = _offsets(receiver_tokenizer, text)
    if r is None:
        raise PlasticError("aligning with a remote transmitter needs a fast receiver tokenizer "
                           "(character offsets)")
    rids, roffs = r
    if not rids:
        raise PlasticError(f"text {text!r} encodes to no tokens; give a non-empty prompt")
    rids, rshift = _with_bos(receiver_tokenizer, rids)
    tshift = 1 if transmitter_bos else 0
    return rids, _index([e for _, e in roffs], transmitter_ends[tshift:], rshift, tshift)
