"""Inference modes of FedRefine behind one API: alone, t2t, c2c, multi and co-c2c.

Every mode first *prepares* the receiver's state for a prompt (a KV cache, fused or not, and
the receiver tokens still to run), then scores answer choices or decodes from it. Aligned
fusion follows C2C: receiver prefill, transmitter prefill, fusion into the receiver cache,
then the last prompt token runs unfused on the fused cache (with the ``fuse_last`` ablation the
cache covers the whole prompt and the last token runs again at its own position). Prefix fusion
(the private mode: transmitters encode a rephrased prompt) puts the projected transmitter
cache after the receiver's BOS and runs the prompt after it.
"""


from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from plasticlm.errors import PlasticError
from plasticlm.refine.align import align_to_ends, align_tokens
from plasticlm.refine.cache import KVCache, extract_cache
from plasticlm.refine.decode import Prepared, argmax, greedy_decode, score_choices
from plasticlm.refine.fuser import Fuser
from plasticlm.refine.peer import Peer, Transmitter, as_batch, prompt_ids
from plasticlm.refine.rephrase import rephrase

MODES = ("alone", "t2t", "c2c", "multi", "co-c2c")


ORDERS = ("parallel", "sequence")


@dataclass
class Link:
    """A transmitter (a :class:`Peer` here, or a remote one) and the fuser that carries its
    cache into the receiver (None: the transmitter can only help by text, mode t2t)."""

    peer: Transmitter
    fuser: Fuser | None = None


@dataclass
class RefineConfig:
    """How the modes run (defaults follow C2C and the paper)."""

    private: bool = False          # transmitters encode a rephrased prompt (needs prefix fusers)
    order: str = "parallel"        # multi: fuse all transmitters on the receiver's own cache
                                   # (parallel) or each on the result of the previous (sequence)
    rounds: int = 1                # co-c2c exchanges
    t2t_max_new_tokens: int = 12
    t2t_template: str = "{prompt}{background}\n{prompt}"


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


def _add_time(seconds: dict[str, float], step: str, t: float) -> None:
    seconds[step] = seconds.get(step, 0.0) + t


def _device(peer: Peer) -> torch.device:
    return next(peer.model.parameters()).device


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
        if self.config.order not in ORDERS:
            raise PlasticError(f"unknown order {self.config.order!r}; use one of {ORDERS}")
        for link in self.links:
            if link.fuser is not None:
                link.fuser.check(receiver.layout, link.peer.layout)
                link.fuser.to(_device(receiver))  # it writes into the receiver's cache
        if reverse_fuser is not None and self.links and isinstance(self.links[0].peer, Peer):
            reverse_fuser.to(_device(self.links[0].peer))

    # -- preparing the receiver's state ------------------------------------------------------

    def links_for(self, mode: str, n: int | None = None) -> list[Link]:
        """The links ``mode`` uses (c2c and co-c2c: the first; multi and t2t: the first
        ``n``, default all)."""
        if mode in ("alone",):
            return []
        if not self.links:
            raise PlasticError(f"mode {mode!r} needs at least one transmitter (none given)")
        if mode in ("c2c", "co-c2c"):
            return self.links[:1]
        return self.links[: n or len(self.links)]

    def _alone(self, prompt: str) -> Prepared:
        ids = prompt_ids(self.receiver.tokenizer, prompt)
        cache, _ = extract_cache(self.receiver.model, as_batch(ids[:-1]),
                                 model_name=self.receiver.name)
        return Prepared(cache, ids[-1:], ids)

    def _transmit_text(self, prompt: str, seconds: dict[str, float]) -> str:
        if not self.config.private:
            return prompt
        t0 = time.perf_counter()
        r = self.rephraser
        text = rephrase(prompt, r.model if r else None, r.tokenizer if r else None)[0]
        _add_time(seconds, "rephrase", time.perf_counter() - t0)
        return text

    def _transmit(self, link: Link, text: str, seconds: dict[str, float]):
        c = link.fuser.config
        sent = link.peer.prefill(text, c.draft_tokens if c.mode == "prefix" else 0,
                                 link.fuser.transmitter_layers_read, c.share)
        sent.cache = sent.cache.to(_device(self.receiver))   # received caches arrive on CPU
        for step, t in sent.seconds.items():
            _add_time(seconds, step, t)
        return sent

    def prepare(self, prompt: str, mode: str = "c2c", n_transmitters: int | None = None
                ) -> Prepared:
        """The receiver's state for ``prompt`` in ``mode`` (co-c2c: see :meth:`co_prepare`)."""
        if mode not in MODES:
            raise PlasticError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        links = self.links_for(mode, n_transmitters)
        by_mode = {"alone": lambda: self._alone(prompt),
                   "t2t": lambda: self._t2t(prompt, links),
                   "c2c": lambda: self._fused(prompt, links),
                   "multi": lambda: self._fused(prompt, links),
                   "co-c2c": lambda: self.co_prepare(prompt)[0]}
        return by_mode[mode]()

    def _t2t(self, prompt: str, links: list[Link]) -> Prepared:
        seconds: dict[str, float] = {}
        text = self._transmit_text(prompt, seconds)
        t0 = time.perf_counter()
        backgrounds = [link.peer.generate(text, self.config.t2t_max_new_tokens, ("\n",))
                       for link in links]
        _add_time(seconds, "transmitter", time.perf_counter() - t0)
        full = prompt
        for bg in backgrounds:
            full = self.config.t2t_template.format(prompt=full, background=bg)
        prep = self._alone(full)
        prep.background = backgrounds
        prep.rephrased = [text] if self.config.private else []
        prep.wire_bytes = sum(len(text.encode()) + len(bg.encode()) for bg in backgrounds)
        prep.seconds = seconds
        return prep

    def _fused(self, prompt: str, links: list[Link]) -> Prepared:
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
            return self._prefix(prompt, links)
        if self.config.private:
            raise PlasticError("private mode shares caches of a rephrased prompt, which only "
                               "prefix fusers can read; train fusers with mode=prefix")
        r = self.receiver
        ids = prompt_ids(r.tokenizer, prompt)
        fuse_last = links[0].fuser.config.fuse_last
        if any(link.fuser.config.fuse_last != fuse_last for link in links):
            raise PlasticError("all aligned fusers must agree on fuse_last")
        n_fused = len(ids) if fuse_last else len(ids) - 1
        own, _ = extract_cache(r.model, as_batch(ids[:n_fused]), model_name=r.name)
        fused, wire, seconds = own, 0, {}
        for link in links:
            sent = self._transmit(link, prompt, seconds)
            t0 = time.perf_counter()
            receiver_ids, index = align_to_ends(r.tokenizer, prompt, sent.token_ends,
                                                sent.has_bos)
            if receiver_ids != ids:
                raise PlasticError("receiver tokens differ between alignment and prompt "
                                   "encoding; the tokenizer is not deterministic")
            base = own if self.config.order == "parallel" else fused
            out = link.fuser.fuse_aligned(base, sent.cache, torch.tensor([index[:n_fused]]))
            if self.config.order == "parallel":
                fused = fused.add_delta(*out.delta(own))
            else:
                fused = out
            _add_time(seconds, "fuse", time.perf_counter() - t0)
            wire += len(prompt.encode()) + sent.wire_bytes
        return Prepared(fused, ids[-1:], ids, wire, start=len(ids) - 1, seconds=seconds)

    def _prefix(self, prompt: str, links: list[Link]) -> Prepared:
        r = self.receiver
        ids = prompt_ids(r.tokenizer, prompt)
        has_bos = r.tokenizer.bos_token_id is not None and ids[0] == r.tokenizer.bos_token_id
        seconds: dict[str, float] = {}
        text = self._transmit_text(prompt, seconds)
        start = 1 if has_bos else 0
        prefixes, wire = [], 0
        for link in links:
            sent = self._transmit(link, text, seconds)
            t0 = time.perf_counter()
            p = link.fuser.prefix(sent.cache, r.layout, start=start, skip_first=not sent.first,
                                  prompt_length=sent.prompt_tokens - sent.first)
            _add_time(seconds, "fuse", time.perf_counter() - t0)
            prefixes.append(p)
            start += p.length
            wire += len(text.encode()) + sent.wire_bytes
        state = KVCache.concat(prefixes)
        if has_bos:
            bos, _ = extract_cache(r.model, as_batch(ids[:1]), model_name=r.name)
            state = bos.cat(state)
        return Prepared(state, ids[1:] if has_bos else ids, ids, wire,
                        rephrased=[text] if self.config.private else [], seconds=seconds)

    def co_prepare(self, prompt: str) -> tuple[Prepared, Prepared]:
        """Co-C2C: receiver and partner 0 refine each other over ``config.rounds`` exchanges
        (aligned fusers both ways); returns both prepared states (receiver's first)."""
        if not self.links or self.reverse_fuser is None:
            raise PlasticError("co-c2c needs a transmitter and the reverse fuser (receiver -> "
                               "transmitter); pass reverse_fuser")
        if self.config.private:
            raise PlasticError("co-c2c exchanges aligned caches; it has no private variant")
        a, link = self.receiver, self.links[0]
        b, f_ba, f_ab = link.peer, link.fuser, self.reverse_fuser
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
        for _ in range(max(1, self.config.rounds)):
            a_new = f_ba.fuse_aligned(a_own, b_send, idx_ab)
            b_new = f_ab.fuse_aligned(b_own, a_send, idx_ba)
            wire += (b_send.wire_bytes(f_ba.transmitter_layers_read)
                     + a_send.wire_bytes(f_ab.transmitter_layers_read))
            a_send, b_send = a_new, b_new
        ids_a, ids_b = al_ab.receiver_ids, al_ba.receiver_ids
        wire += len(prompt.encode())
        return (Prepared(a_send, ids_a[-1:], ids_a, wire, start=len(ids_a) - 1),
                Prepared(b_send, ids_b[-1:], ids_b, wire, start=len(ids_b) - 1))

    # -- using the state ----------------------------------------------------------------------

    @torch.no_grad()
    def score(self, prompt: str, choices: list[str], mode: str = "c2c",
              n_transmitters: int | None = None) -> Scored:
        """Sum log-prob of each `` <choice>`` after ``prompt``, with time to first token
        (state ready + the one batched forward over the choices, which yields the first answer
        token's distribution), latency and bytes."""
        t0 = time.perf_counter()
        if mode == "co-c2c":
            prep, partner = self.co_prepare(prompt)
        else:
            prep, partner = self.prepare(prompt, mode, n_transmitters), None
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
        if mode == "co-c2c":
            prep, partner = self.co_prepare(prompt)
        else:
            prep, partner = self.prepare(prompt, mode, n_transmitters), None
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
