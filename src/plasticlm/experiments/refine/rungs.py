"""``plasticlm refine experiment ladder``: where between "the cache can carry it" and "a trained
fuser carries it" the transfer is lost. Every rung is scored on the held-out entities beside
its control transmitter (one that knows nothing), and as a fraction of the ceiling, rung (b):

- (a) ``zero``: an untrained fuser (its output map starts at zero) must equal alone, item for
  item;
- (b) ``handover``: the oracle's cache handed to the receiver untouched (:func:`handover_fuser`;
  the oracle is the receiver taught every fact, so its cache fits the receiver): the ceiling;
- (c) ``regression``: a trainable fuser fitted to reproduce the oracle's cache (objective
  ``cache``, teacher the oracle) on the dev/val prompts, no scored entity: can a fuser of this
  architecture carry it?
- (d) ``scored``: the recipe (``fuser``) trained on the scored items themselves: the recipe's
  upper bound;
- (e) ``general``: the recipe on general data only; its control, the receiver fused with
  itself, is rung (f), self-fusion;
- (g) ``specialist``: the recipe from the heterogeneous specialist (another family, width and
  tokenizer), beside the control transmitter of its shape; with the specialist's probe gate.

For (b)-(e) the knowing transmitter is the oracle and the control is the receiver (the same
model without the facts). A recipe whose objective needs a teacher (``cache``) regresses
toward the oracle's cache in every row, the controls' included.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

import torch
from torch import nn

from plasticlm.config import Field, configclass
from plasticlm.errors import PlasticError
from plasticlm.eval import qa_continuation
from plasticlm.experiments.refine.ladder import Ladder, score_items
from plasticlm.experiments.refine.taught import Facts, oracle_peer
from plasticlm.experiments.refine.training_text import TrainText, training_examples
from plasticlm.refine.examples import Example
from plasticlm.refine.fedrefine import FedRefine
from plasticlm.refine.fusers.fuser import Fuser
from plasticlm.refine.fusers.objectives import needs_teacher
from plasticlm.refine.fusers.train import FuserTrainConfig
from plasticlm.refine.link import Link
from plasticlm.refine.peer import Peer

Rung = Literal["zero", "handover", "regression", "scored", "general", "specialist"]
RUNGS = get_args(Rung)


@configclass
class LadderConfig:
    """Sizes of the ladder (loadable from TOML/YAML, key=value overrides)."""

    receiver: str = Field("sandbox:receiver", description="the receiver model")
    specialist: str = Field("sandbox:specialist", description="rung g: the heterogeneous "
                            "transmitter that knows the private facts")
    control: str = Field("sandbox:transmitter-llama", description="rung g's control: the "
                         "specialist's shape, no private fact")
    # The recipe that won on the sandbox (docs/results/refine.md, "Recipes tried"): cache
    # regression toward the oracle, 4 epochs of 2,000 examples, half general, half domain.
    fuser: FuserTrainConfig = Field(
        default_factory=lambda: FuserTrainConfig(objective="cache", epochs=4),
        description="the recipe under test (rungs d, e, f, g)")
    general_examples: int = Field(2000, gt=0, description="training examples of rungs e, "
                                  "f, g")
    train_text: TrainText = Field("general+domain", description="what rungs e, f, g train on: the "
                                  "world's general corpus, the specialist's own-domain corpus "
                                  "without any evaluation entity, or half of each")
    task_epochs: int = Field(4, gt=0, description="epochs of rungs c and d")
    seeds: int = Field(3, gt=0, description="fuser training seeds per trained rung")
    max_eval: int = Field(0, ge=0, description="test questions kept (0: the whole split)")
    max_task: int = Field(0, ge=0, description="dev/val examples of rung c (0: all)")
    teach_steps: int = Field(500, gt=0, description="fact drills that make the oracle")
    teach_lr: float = Field(1e-3, gt=0, description="learning rate of the fact drills")
    teach_replay: int = Field(4, ge=0, description="corpus blocks replayed per drill step")
    shipped_taught: bool = Field(True, description="take the shipped taught oracle "
                                 "(plasticlm.experiments.refine.shipped_taught) when it was taught from "
                                 "the same weights, facts and drill settings; false teaches "
                                 "it here (about 2.5 min on 2 cores)")
    rungs: tuple[Rung, ...] = Field(RUNGS, description="which rungs run (alone always does)")
    out: str = Field("runs/refine-ladder", description="run folder")
    progress: bool = Field(True, description="show progress bars and log rows")


class HandOverLayer(nn.Module):
    """A fuser layer whose change is (transmitter - receiver): the fused cache *is* the
    transmitter's. Parameter-free; for a transmitter of the receiver's own architecture."""

    def forward(self, t_keys: torch.Tensor, t_values: torch.Tensor,
                r_keys: torch.Tensor | None = None, r_values: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return t_keys - r_keys, t_values - r_values

    def gates_on(self) -> tuple[bool, bool]:
        return True, True


def handover_fuser(receiver: Peer, transmitter: Peer) -> Fuser:
    """A fuser that hands ``transmitter``'s cache to ``receiver`` untouched (rung b): every
    receiver layer reads the same transmitter layer, keys de-rotated and re-rotated like any
    fuser's. Refused unless both have one architecture and tokenizer."""
    r, t = receiver.layout, transmitter.layout
    same = ((r.num_layers, r.num_kv_heads, r.head_dim) == (t.num_layers, t.num_kv_heads,
                                                            t.head_dim)
            and torch.allclose(r.inv_freq.float(), t.inv_freq.float())
            and receiver.tokenizer.get_vocab() == transmitter.tokenizer.get_vocab())
    if not same:
        raise PlasticError(f"a hand-over needs one architecture and tokenizer: "
                           f"{transmitter.name!r} and {receiver.name!r} differ")
    fuser = Fuser.for_pair(r, t, kind="c2c", hidden=8, layer_map="last",
                           receiver_name=receiver.name, transmitter_name=transmitter.name)
    fuser.layers = nn.ModuleList(HandOverLayer() for _ in fuser.layers)
    return fuser.to(next(receiver.model.parameters()).device).eval()


def zero_fuser(receiver: Peer, transmitter: Peer) -> Fuser:
    """An untrained C2C fuser (rung a): its output map starts at zero."""
    torch.manual_seed(0)
    fuser = Fuser.for_pair(receiver.layout, transmitter.layout, kind="c2c",
                           receiver_name=receiver.name, transmitter_name=transmitter.name)
    return fuser.to(next(receiver.model.parameters()).device).eval()


LABELS = {  # rung -> (knowing row, its control row)
    "zero": ("a. zero fuser, oracle", "alone"),
    "handover": ("b. hand-over (ceiling), oracle", "b. hand-over, receiver"),
    "regression": ("c. cache regression on dev/val prompts, oracle",
                   "c. cache regression on dev/val prompts, receiver"),
    "scored": ("d. recipe on the scored items, oracle", "d. recipe on the scored items, receiver"),
    "general": ("e. recipe on general data, oracle", "f. self-fusion: recipe on general data, "
                "receiver"),
    "specialist": ("g. recipe on general data, specialist",
                   "g. recipe on general data, control transmitter"),
}


def _pair(lad: Ladder, rung: str, knows: Peer, blank: Peer, examples: list[Example],
          fcfg: FuserTrainConfig, teacher: Peer | None) -> None:
    """A trained rung: per seed, one fuser from ``knows`` and one from ``blank``, each trained
    the same way (its own losses and gates recorded), scored on the test items."""
    teacher = teacher if needs_teacher(fcfg.objective) else None
    for label, peer in zip(LABELS[rung], (knows, blank)):
        def run_seed(seed: int, label=label, peer=peer):
            (fuser,), losses = lad.fit(f"{rung}|{label}", lad.receiver, [peer], examples, fcfg,
                                       seed, teacher=teacher)
            fr = FedRefine(lad.receiver, [Link(peer, fuser)])
            return ({label: score_items(fr, lad.test_items, "c2c", lad.cfg.progress, label)},
                    losses, fuser.gates_on())
        lad.seeded([label], run_seed)


def recipe_examples(lad: Ladder) -> list[Example]:
    """The examples of rungs e, f and g (``train_text``)."""
    return training_examples(lad.cfg.train_text, lad.cfg.general_examples, lad.corpus,
                             lad.cfg.receiver, set(lad.groups))


def run_rungs(lad: Ladder) -> Peer:
    """Every rung of ``lad.cfg.rungs``; returns the oracle."""
    cfg = lad.cfg
    rungs = set(cfg.rungs)
    receiver = lad.receiver
    lad.once("alone", FedRefine(receiver), "alone")
    oracle = oracle_peer(lad, Facts(lad))
    if rungs & {"regression", "scored", "general"}:
        lad.probe_pair("probe_oracle", oracle, receiver)   # the oracle pair's gate
    if "zero" in rungs:
        lad.once(LABELS["zero"][0], FedRefine(receiver, [Link(oracle, zero_fuser(receiver,
                                                                                oracle))]), "c2c")
        lad.extra["zero_equals_alone"] = lad.scores[LABELS["zero"][0]] == lad.scores["alone"]
    if "handover" in rungs:
        for label, peer in zip(LABELS["handover"], (oracle, receiver)):
            lad.once(label, FedRefine(receiver, [Link(peer, handover_fuser(receiver, peer))]),
                     "c2c")
    if "regression" in rungs:
        train = [Example(it.prompt, qa_continuation(it.choices[it.answer]))
                 for it in lad.train_items][: cfg.max_task or None]
        _pair(lad, "regression", oracle, receiver, train,
              dataclasses.replace(cfg.fuser, objective="cache", epochs=cfg.task_epochs), oracle)
    if "scored" in rungs:
        scored = [Example(it.prompt, qa_continuation(it.choices[it.answer]))
                  for it in lad.test_items]
        _pair(lad, "scored", oracle, receiver, scored,
              dataclasses.replace(cfg.fuser, epochs=cfg.task_epochs), oracle)
    general = recipe_examples(lad)
    if "general" in rungs:
        _pair(lad, "general", oracle, receiver, general, cfg.fuser, oracle)
    if "specialist" in rungs:
        lad.probe_pair("probe", lad.specialist, lad.control)
        lad.once("transmitter alone, specialist", FedRefine(lad.specialist), "alone")
        _pair(lad, "specialist", lad.specialist, lad.control, general, cfg.fuser, oracle)
    return oracle
