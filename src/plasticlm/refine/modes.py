"""FedRefine's inference modes, one registered class each (``MODES``, the only place they are
listed): alone, t2t, c2c, multi and co-c2c.

A mode picks the receiver's links it uses (:class:`~plasticlm.refine.link.Link`) and
*prepares* the receiver's state for a prompt (a KV cache, fused or not, and the receiver tokens
still to run) from what it reads of the asker (:class:`Refiner`: receiver, config, rephraser,
reverse fuser); :class:`~plasticlm.refine.fedrefine.FedRefine` then scores answer choices or
decodes from it. A mode where both sides refine (co-c2c) also prepares the
partner's state. Add a mode with ``@MODES.register(name)`` on a :class:`Mode` subclass; a
transmitter is anything with ``name``, ``layout``, ``prefill`` and ``generate`` (the
``Transmitter`` protocol of :mod:`plasticlm.refine.peer`), so a mode runs across the network
unchanged.
"""


from __future__ import annotations

import time
from typing import Literal, Protocol, get_args

import torch

from plasticlm.config import Field, configclass
from plasticlm.errors import PlasticError
from plasticlm.refine.cache import extract_cache
from plasticlm.refine.decode import Prepared
from plasticlm.refine.fusers.align import align_tokens
from plasticlm.refine.fusers.fuser import Fuser
from plasticlm.refine.fusion import add_time, from_every_link, fused_state, transmit_text
from plasticlm.refine.link import Link
from plasticlm.refine.peer import Peer, as_batch, prompt_ids
from plasticlm.registry import Registry

Order = Literal["parallel", "sequence"]
ORDERS = get_args(Order)


@configclass
class RefineConfig:
    """How the modes run (defaults follow C2C and the paper)."""

    private: bool = Field(False, description="transmitters encode a rephrased prompt (needs "
                          "prefix fusers)")
    order: Order = Field("parallel", description="multi: fuse every transmitter on the "
                         "receiver's own cache (parallel) or each on the result of the "
                         "previous (sequence)")
    rounds: int = Field(1, ge=1, description="co-c2c: exchanges between the two models")
    t2t_max_new_tokens: int = Field(12, ge=0, description="t2t: tokens each transmitter "
                                    "writes as background")
    t2t_line: str = Field("{prompt}{background}\n", description="t2t: one transmitter's "
                          "background as the receiver reads it, a line before the prompt (the "
                          "default states the prompt with the transmitter's answer, the form "
                          "the sandbox's reading drills teach)")
    concurrent: bool = Field(True, description="ask the transmitters at the same time (a "
                             "thread each), not one after another")


class Refiner(Protocol):
    """What a mode reads of the one asking (a :class:`~plasticlm.refine.fedrefine.FedRefine`):
    the receiver, how the modes run, who rephrases (private) and the fuser back to partner 0
    (co-c2c)."""

    receiver: Peer
    config: RefineConfig
    rephraser: Peer | None
    reverse_fuser: Fuser | None


def _fused(fr: Refiner, prompt: str, links: list[Link]) -> Prepared:
    c = fr.config
    return fused_state(fr.receiver, prompt, links, c.order, c.private, fr.rephraser,
                       c.concurrent)


class Mode:
    """A FedRefine mode: the links it uses and the receiver's state it prepares."""

    uses_links = True     # False: the receiver answers by itself
    reads_caches = True   # False: transmitters help by text, no fuser needed
    served = True         # a network peer (`refine serve`) can answer in this mode

    @classmethod
    def links(cls, links: list[Link], n: int | None) -> list[Link]:
        """The links used, of the receiver's (at least one): the first ``n``, default all."""
        return links[: n or len(links)]

    @classmethod
    def prepare(cls, fr: Refiner, prompt: str, links: list[Link]
                ) -> tuple[Prepared, Prepared | None]:
        """The receiver's state for ``prompt`` (and the partner's, or None)."""
        raise NotImplementedError


MODES: Registry[type[Mode]] = Registry("FedRefine mode")


def alone_state(receiver: Peer, prompt: str) -> Prepared:
    """The receiver's own cache of the prompt but its last token."""
    ids = prompt_ids(receiver.tokenizer, prompt)
    cache, _ = extract_cache(receiver.model, as_batch(ids[:-1]), model_name=receiver.name)
    return Prepared(cache, ids[-1:], ids)


@MODES.register("alone")
class Alone(Mode):
    """The receiver answers by itself."""

    uses_links = reads_caches = False

    @classmethod
    def prepare(cls, fr, prompt, links):
        return alone_state(fr.receiver, prompt), None


@MODES.register("t2t")
class TextToText(Mode):
    """Each transmitter writes a background that the receiver reads as a line before the
    prompt (``RefineConfig.t2t_line``); the transmitters write at the same time."""

    reads_caches = False

    @classmethod
    def prepare(cls, fr, prompt, links):
        seconds: dict[str, float] = {}
        text = transmit_text(prompt, seconds, fr.config.private, fr.rephraser)
        def write(link, _seconds):
            return link.peer.generate(text, fr.config.t2t_max_new_tokens, ("\n",))
        t0 = time.perf_counter()
        backgrounds = from_every_link(links, write, {}, fr.config.concurrent)
        add_time(seconds, "transmitter", time.perf_counter() - t0)
        # one line per transmitter, then the prompt once (n transmitters: n lines, not a
        # template nested n times)
        full = "".join(fr.config.t2t_line.format(prompt=prompt, background=bg)
                       for bg in backgrounds) + prompt
        prep = alone_state(fr.receiver, full)
        prep.background = backgrounds
        prep.rephrased = [text] if fr.config.private else []
        prep.wire_bytes = sum(len(text.encode()) + len(bg.encode()) for bg in backgrounds)
        prep.seconds = seconds
        return prep, None


@MODES.register("c2c")
class CacheToCache(Mode):
    """The first transmitter's cache fused into the receiver's (aligned or prefix)."""

    @classmethod
    def links(cls, links, n):
        return links[:1]

    @classmethod
    def prepare(cls, fr, prompt, links):
        return _fused(fr, prompt, links), None


@MODES.register("multi")
class Multi(Mode):
    """The first ``n`` transmitters' caches fused in (``RefineConfig.order``)."""

    @classmethod
    def prepare(cls, fr, prompt, links):
        return _fused(fr, prompt, links), None


@MODES.register("co-c2c")
class CoC2C(Mode):
    """Co-C2C: the receiver and partner 0 refine each other over ``RefineConfig.rounds``
    exchanges (aligned fusers both ways: the link's and ``FedRefine.reverse_fuser``)."""

    served = False        # both models run in this process

    @classmethod
    def links(cls, links, n):
        return links[:1]

    @classmethod
    def prepare(cls, fr, prompt, links):
        if fr.reverse_fuser is None:
            raise PlasticError("co-c2c needs a transmitter and the reverse fuser (receiver -> "
                               "transmitter); pass reverse_fuser")
        if fr.config.private:
            raise PlasticError("co-c2c exchanges aligned caches; it has no private variant")
        a, link = fr.receiver, links[0]
        b, f_ba, f_ab = link.peer, link.fuser, fr.reverse_fuser
        if not isinstance(b, Peer):
            raise PlasticError("co-c2c runs both models in this process; give the partner as "
                               "a local model, not a remote peer")
        if "prefix" in (f_ba.config.mode, f_ab.config.mode):
            raise PlasticError("co-c2c needs aligned fusers in both directions")
        f_ab.check(b.layout, a.layout)
        al_ab = align_tokens(a.tokenizer, b.tokenizer, prompt)   # A's positions read B's
        al_ba = align_tokens(b.tokenizer, a.tokenizer, prompt)
        a_full, _ = extract_cache(a.model, as_batch(al_ab.receiver_ids), model_name=a.name)
        b_full, _ = extract_cache(b.model, as_batch(al_ba.receiver_ids), model_name=b.name)
        cut_a = a_full.length - (0 if f_ba.config.fuse_last else 1)
        cut_b = b_full.length - (0 if f_ab.config.fuse_last else 1)
        a_own, b_own = a_full.truncate(cut_a), b_full.truncate(cut_b)
        idx_ab, idx_ba = torch.tensor([al_ab.index[:cut_a]]), torch.tensor([al_ba.index[:cut_b]])
        a_send, b_send, wire = a_full, b_full, 0
        for _ in range(fr.config.rounds):
            a_new = f_ba.fuse_aligned(a_own, b_send, idx_ab)
            b_new = f_ab.fuse_aligned(b_own, a_send, idx_ba)
            wire += (b_send.wire_bytes(f_ba.transmitter_layers_read)
                     + a_send.wire_bytes(f_ab.transmitter_layers_read))
            a_send, b_send = a_new, b_new
        ids_a, ids_b = al_ab.receiver_ids, al_ba.receiver_ids
        wire += len(prompt.encode())
        return (Prepared(a_send, ids_a[-1:], ids_a, wire, start=len(ids_a) - 1),
                Prepared(b_send, ids_b[-1:], ids_b, wire, start=len(ids_b) - 1))
