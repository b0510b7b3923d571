"""A receiver's link to one transmitter: what the FedRefine modes
(:mod:`plasticlm.refine.modes`) and the cache fusion behind them (:mod:`plasticlm.refine.fusion`)
read a transmitter through."""

from __future__ import annotations

from dataclasses import dataclass

from plasticlm.refine.fusers.fuser import Fuser
from plasticlm.refine.peer import Transmitter


@dataclass
class Link:
    """A transmitter (a :class:`~plasticlm.refine.peer.Peer` here, or a remote one) and the
    fuser that carries its cache into the receiver (None: the transmitter can only help by
    text, mode t2t)."""

    peer: Transmitter
    fuser: Fuser | None = None
