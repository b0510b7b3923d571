"""How the inner loop chooses a context's layers: one registered class per rule
(``SELECTIONS``, the only list of them), named by :func:`plasticlm.scol.stream.consolidate_stream`'s
``selection``. A rule proposes candidate layer sets; a rule that is ``scored`` has every
candidate adapted and rewarded, commits the best and yields preference pairs; the others
commit their one candidate. Add a rule with ``@SELECTIONS.register(name)`` on a
:class:`Selection` subclass.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from plasticlm.errors import PlasticError
from plasticlm.registry import Registry
from plasticlm.scol.config import SCoLConfig
from plasticlm.scol.policy import LayerGrammar, sample_actions

SELECTIONS: Registry[type[Selection]] = Registry("SCoL selection")


@dataclass
class Turn:
    """What a rule sees at one context: the running model (the policy), its action prompt
    and grammar, the settings, the stream's generators and the fixed layers (``fixed``)."""

    model: object
    tokenizer: object
    prompt: str
    grammar: LayerGrammar
    cfg: SCoLConfig
    gen: torch.Generator
    rng: random.Random
    num_layers: int
    layers: tuple[int, ...] | None = None


class Selection:
    """A layer-selection rule."""

    scored = False   # candidates rewarded, the best committed, preference pairs collected

    @classmethod
    def check(cls, layers: Sequence[int] | None, num_layers: int) -> None:
        """Refuse, before any work, what the rule cannot run with."""

    @classmethod
    def candidates(cls, turn: Turn) -> tuple[list[tuple[int, ...]], list[list[int]]]:
        """``(layer sets, completion token ids)``, one pair per candidate (no completion:
        ``[]``)."""
        raise NotImplementedError

    @classmethod
    def choose(cls, totals: Sequence[float]) -> int:
        """The index of the committed candidate, given their rewards' totals (the first
        best; a rule that is not scored has one candidate)."""
        return max(range(len(totals)), key=totals.__getitem__) if totals else 0


def _sampled(turn: Turn, k: int, temperature: float):
    sampled = sample_actions(turn.model, turn.tokenizer, turn.prompt, turn.grammar, k,
                             temperature, turn.gen)
    return [a.layers for a in sampled], [a.token_ids for a in sampled]


@SELECTIONS.register("best")
class Best(Selection):
    """K actions sampled from the policy; each is adapted and rewarded, the best committed."""

    scored = True

    @classmethod
    def candidates(cls, turn):
        return _sampled(turn, turn.cfg.k, turn.cfg.temperature)


@SELECTIONS.register("greedy")
class Greedy(Selection):
    """The policy's greedy action (no reward needed)."""

    @classmethod
    def candidates(cls, turn):
        return _sampled(turn, 1, 0.0)


@SELECTIONS.register("random")
class RandomLayers(Selection):
    """Random layers, as many as the policy's greedy action names."""

    @classmethod
    def candidates(cls, turn):
        actions, completions = _sampled(turn, 1, 0.0)
        return [tuple(sorted(turn.rng.sample(range(turn.num_layers), len(actions[0]))))], \
            completions


@SELECTIONS.register("all")
class AllLayers(Selection):
    """Every layer: sequential fine-tuning."""

    @classmethod
    def candidates(cls, turn):
        return [tuple(range(turn.num_layers))], [[]]


@SELECTIONS.register("fixed")
class Fixed(Selection):
    """The given ``layers`` at every context."""

    @classmethod
    def check(cls, layers, num_layers):
        if not layers or any(not 0 <= x < num_layers for x in layers):
            raise PlasticError(f"selection 'fixed' needs layers in 0..{num_layers - 1}, "
                               f"got {layers!r}")

    @classmethod
    def candidates(cls, turn):
        return [tuple(sorted(turn.layers))], [[]]
