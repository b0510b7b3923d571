"""FedRefine: a receiver answering with its transmitters' help, in any mode of ``MODES``
(:mod:`plasticlm.refine.modes`), with what each answer cost (time to first token, latency,
bytes on the wire, seconds per step)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from plasticlm.errors import PlasticError
from plasticlm.refine.decode import Prepared, argmax, greedy_decode, score_choices
from plasticlm.refine.fusers.fuser import Fuser
from plasticlm.refine.fusion import device_of
from plasticlm.refine.link import Link
from plasticlm.refine.modes import MODES, RefineConfig
from plasticlm.refine.peer import Peer


@dataclass
class Scored:
    """Choice scores (summed log-probs) of one question in one mode, with its costs."""

    scores: list[float]
    choice: int
    ttft: float
    latency: float
    wire_bytes: int
    partner_scores: list[float] | None = None   # co-c2c: the other model's refined answer
    partner_choice: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)   # per step


@dataclass
class Answer:
    text: str
    ttft: float
    latency: float
    wire_bytes: int
    background: list[str] = field(default_factory=list)
    rephrased: list[str] = field(default_factory=list)
    partner_text: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)   # per step


class FedRefine:
    """A receiver with its transmitter links (and, for co-c2c, the fuser back to partner 0).

    >>> fr = FedRefine(receiver, [Link(specialist, fuser)])            # doctest: +SKIP
    >>> fr.score("Q: Which organ does Ofloxin act on? A:", choices, "c2c").choice
    """

    def __init__(self, receiver: Peer, links: list[Link] = (), config: RefineConfig | None = None,
                 reverse_fuser: Fuser | None = None, rephraser: Peer | None = None):
        self.receiver = receiver
        self.links = list(links)
        self.config = config or RefineConfig()
        self.reverse_fuser = reverse_fuser
        self.rephraser = rephraser
        for link in self.links:
            if link.fuser is not None:
                link.fuser.check(receiver.layout, link.peer.layout)
                link.fuser.to(device_of(receiver))  # it writes into the receiver's cache
        if reverse_fuser is not None and self.links and isinstance(self.links[0].peer, Peer):
            reverse_fuser.to(device_of(self.links[0].peer))

    def links_for(self, mode: str, n: int | None = None) -> list[Link]:
        """The links ``mode`` uses (c2c and co-c2c: the first; multi and t2t: the first
        ``n``, default all; alone: none)."""
        if not MODES[mode].uses_links:
            return []
        if not self.links:
            raise PlasticError(f"mode {mode!r} needs at least one transmitter (none given)")
        return MODES[mode].links(self.links, n)

    def states(self, prompt: str, mode: str = "c2c", n_transmitters: int | None = None
               ) -> tuple[Prepared, Prepared | None]:
        """The receiver's state for ``prompt`` in ``mode``, and the partner's (co-c2c) or
        None."""
        MODES.check(mode)
        return MODES[mode].prepare(self, prompt, self.links_for(mode, n_transmitters))

    def prepare(self, prompt: str, mode: str = "c2c", n_transmitters: int | None = None
                ) -> Prepared:
        """The receiver's state for ``prompt`` in ``mode``."""
        return self.states(prompt, mode, n_transmitters)[0]

    @torch.no_grad()
    def score(self, prompt: str, choices: list[str], mode: str = "c2c",
              n_transmitters: int | None = None) -> Scored:
        """Sum log-prob of each `` <choice>`` after ``prompt``, with time to first token
        (state ready + the one batched forward over the choices, which yields the first answer
        token's distribution), latency and bytes."""
        t0 = time.perf_counter()
        prep, partner = self.states(prompt, mode, n_transmitters)
        t1 = time.perf_counter()
        scores = score_choices(self.receiver.model, self.receiver.tokenizer, prep, prompt,
                               choices)
        ttft = time.perf_counter() - t0
        out = Scored(scores, argmax(scores), ttft, 0.0, prep.wire_bytes,
                     seconds={**prep.seconds, "decode": time.perf_counter() - t1})
        if partner is not None:
            b = self.links[0].peer
            out.partner_scores = score_choices(b.model, b.tokenizer, partner, prompt, choices)
            out.partner_choice = argmax(out.partner_scores)
        out.latency = time.perf_counter() - t0
        return out

    @torch.no_grad()
    def ask(self, prompt: str, mode: str = "c2c", max_new_tokens: int = 24,
            n_transmitters: int | None = None, stop: tuple[str, ...] = ("\n",)) -> Answer:
        """Greedy answer text to ``prompt`` in ``mode``, with its costs."""
        t0 = time.perf_counter()
        prep, partner = self.states(prompt, mode, n_transmitters)
        t1 = time.perf_counter()
        text, first = greedy_decode(self.receiver.model, self.receiver.tokenizer, prep,
                                    max_new_tokens, stop)
        answer = Answer(text, first - t0, time.perf_counter() - t0, prep.wire_bytes,
                        prep.background, prep.rephrased,
                        seconds={**prep.seconds, "decode": time.perf_counter() - t1})
        if partner is not None:
            b = self.links[0].peer
            answer.partner_text = greedy_decode(b.model, b.tokenizer, partner, max_new_tokens,
                                                stop)[0]
        return answer
