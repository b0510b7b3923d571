"""Fusing transmitters' caches into the receiver's state for one prompt, the work behind the
cache modes (:mod:`plasticlm.refine.modes`).

Aligned fusion follows C2C: receiver prefill, transmitter prefill, fusion into the receiver
cache, then the last prompt token runs unfused on the fused cache (with the ``fuse_last``
ablation the cache covers the whole prompt and the last token runs again at its own
position). Prefix fusion (the private mode: transmitters encode a rephrased prompt) puts the
projected transmitter cache after the receiver's BOS and runs the prompt after it.

The functions take what they read of the :class:`~plasticlm.refine.fedrefine.FedRefine`
asking as arguments: its receiver, its links, ``RefineConfig.private`` and ``order``, and its
rephraser.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from plasticlm.errors import PlasticError
from plasticlm.refine.cache import KVCache, extract_cache
from plasticlm.refine.decode import Prepared
from plasticlm.refine.fusers.align import align_to_ends
from plasticlm.refine.link import Link
from plasticlm.refine.peer import Peer, as_batch, prompt_ids
from plasticlm.refine.rephrase import rephrase


def add_time(seconds: dict[str, float], step: str, t: float) -> None:
    seconds[step] = seconds.get(step, 0.0) + t


def device_of(peer: Peer) -> torch.device:
    return next(peer.model.parameters()).device


def transmit_text(prompt: str, seconds: dict[str, float], private: bool = False,
                  rephraser: Peer | None = None) -> str:
    """What transmitters read: the prompt, or (private) its rephrasing (by ``rephraser``, or
    by rule without one)."""
    if not private:
        return prompt
    t0 = time.perf_counter()
    r = rephraser
    text = rephrase(prompt, r.model if r else None, r.tokenizer if r else None)[0]
    add_time(seconds, "rephrase", time.perf_counter() - t0)
    return text


T = TypeVar("T")


def from_every_link(links: list[Link], ask: Callable[[Link, dict[str, float]], T],
                    seconds: dict[str, float], concurrent: bool = True) -> list[T]:
    """``ask(link, its_seconds)`` for every link, in the links' order: at the same time (a
    thread each: a remote transmitter waits on the network, a local one in torch, which
    releases the GIL) or one after another. A step's seconds add up one after another; at the
    same time the step takes as long as its slowest transmitter."""
    if not concurrent or len(links) < 2:
        return [ask(link, seconds) for link in links]
    own: list[dict[str, float]] = [{} for _ in links]
    with ThreadPoolExecutor(len(links), thread_name_prefix="transmitter") as pool:
        out = list(pool.map(ask, links, own))
    for step in {s for times in own for s in times}:
        add_time(seconds, step, max(times.get(step, 0.0) for times in own))
    return out


def _transmit(receiver: Peer, link: Link, text: str, seconds: dict[str, float]):
    c = link.fuser.config
    sent = link.peer.prefill(text, c.draft_tokens if c.mode == "prefix" else 0,
                             link.fuser.transmitter_layers_read, c.share)
    sent.cache = sent.cache.to(device_of(receiver))   # received caches arrive on CPU
    for step, t in sent.seconds.items():
        add_time(seconds, step, t)
    return sent


def fused_state(receiver: Peer, prompt: str, links: list[Link], order: str = "parallel",
                private: bool = False, rephraser: Peer | None = None,
                concurrent: bool = True) -> Prepared:
    """The receiver's state with every link's cache fused in (aligned or prefix, as the
    links' fusers were trained; aligned: each on the receiver's own cache, ``order``
    parallel, or on the previous result, sequence). The transmitters are asked at the same
    time unless ``concurrent`` is False."""
    missing = [link.peer.name for link in links if link.fuser is None]
    if missing:
        raise PlasticError(f"transmitter(s) {missing} have no fuser: cache fusion needs "
                           "one per transmitter (train it with `plasticlm refine "
                           "train-fuser`), or use mode t2t")
    modes = {link.fuser.config.mode for link in links}
    if len(modes) > 1:
        raise PlasticError("all transmitters' fusers must use the same fusion mode "
                           f"(got {sorted(modes)})")
    if "prefix" in modes:
        return prefix_state(receiver, prompt, links, private, rephraser, concurrent)
    if private:
        raise PlasticError("private mode shares caches of a rephrased prompt, which only "
                           "prefix fusers can read; train fusers with mode=prefix")
    r = receiver
    ids = prompt_ids(r.tokenizer, prompt)
    fuse_last = links[0].fuser.config.fuse_last
    if any(link.fuser.config.fuse_last != fuse_last for link in links):
        raise PlasticError("all aligned fusers must agree on fuse_last")
    n_fused = len(ids) if fuse_last else len(ids) - 1
    own, _ = extract_cache(r.model, as_batch(ids[:n_fused]), model_name=r.name)
    fused, wire, seconds = own, 0, {}
    received = from_every_link(links, lambda link, s: _transmit(r, link, prompt, s), seconds,
                               concurrent)
    for link, sent in zip(links, received):
        t0 = time.perf_counter()
        receiver_ids, index = align_to_ends(r.tokenizer, prompt, sent.token_ends,
                                            sent.has_bos)
        if receiver_ids != ids:
            raise PlasticError("receiver tokens differ between alignment and prompt "
                               "encoding; the tokenizer is not deterministic")
        base = own if order == "parallel" else fused
        out = link.fuser.fuse_aligned(base, sent.cache, torch.tensor([index[:n_fused]]))
        if order == "parallel":
            fused = fused.add_delta(*out.delta(own))
        else:
            fused = out
        add_time(seconds, "fuse", time.perf_counter() - t0)
        wire += len(prompt.encode()) + sent.wire_bytes
    return Prepared(fused, ids[-1:], ids, wire, start=len(ids) - 1, seconds=seconds)


def prefix_state(receiver: Peer, prompt: str, links: list[Link], private: bool = False,
                 rephraser: Peer | None = None, concurrent: bool = True) -> Prepared:
    """The receiver's BOS, then each link's projected cache as extra positions; the prompt
    (private: its rephrasing, for the transmitters) runs after them."""
    r = receiver
    ids = prompt_ids(r.tokenizer, prompt)
    has_bos = r.tokenizer.bos_token_id is not None and ids[0] == r.tokenizer.bos_token_id
    seconds: dict[str, float] = {}
    text = transmit_text(prompt, seconds, private, rephraser)
    start = 1 if has_bos else 0
    prefixes, wire = [], 0
    received = from_every_link(links, lambda link, s: _transmit(r, link, text, s), seconds,
                               concurrent)
    for link, sent in zip(links, received):
        t0 = time.perf_counter()
        p = link.fuser.prefix(sent.cache, r.layout, start=start, skip_first=not sent.first,
                              prompt_length=sent.prompt_tokens - sent.first)
        add_time(seconds, "fuse", time.perf_counter() - t0)
        prefixes.append(p)
        start += p.length
        wire += len(text.encode()) + sent.wire_bytes
    state = KVCache.concat(prefixes)
    if has_bos:
        bos, _ = extract_cache(r.model, as_batch(ids[:1]), model_name=r.name)
        state = bos.cat(state)
    return Prepared(state, ids[1:] if has_bos else ids, ids, wire,
                    rephrased=[text] if private else [], seconds=seconds)
