"""The sections of FedNL's run config (:class:`plasticlm.fednl.config.FedNLConfig`).

Each section is a frozen, validated :func:`plasticlm.config.configclass`; a field naming an
extension point (a method, an aggregation rule, a server optimiser) is checked against its
registry (:mod:`plasticlm.fednl.registries`). A method's own knobs are its own config class,
defined beside it (``FedProxConfig`` in :mod:`plasticlm.fednl.methods.fedprox`, ...), and sit
in ``method`` under the method's name: ``method.fedprox.mu``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from plasticlm.config import Field, configclass
from plasticlm.data.text_sources import is_text_source
from plasticlm.errors import PlasticError
from plasticlm.fednl.methods.fedala import FedALAConfig
from plasticlm.fednl.methods.fedprox import FedProxConfig
from plasticlm.fednl.methods.fedssi import FedSSIConfig
from plasticlm.fednl.registries import AGGREGATORS, FEDERATED_METHODS, SERVER_OPTIMIZERS


@configclass
class DataConfig:
    """Whose data: the clients' split of a world or an MMLU folder."""

    source: str = Field("sandbox", description="'sandbox' (the generated world), a world "
                        "folder, an MMLU folder (dev/ val/ test/ of CSVs), or a text file "
                        "of one's own (.txt, .jsonl, .csv: next-token loss, split iid)")
    split: Literal["domain", "dirichlet", "niah", "openbook", "iid"] = Field(
        "domain", description="domain: 5 clients, one per domain; dirichlet: num_clients "
        "non-IID clients; niah: 7 clients, one NIAH task each; openbook: 5 clients, sandbox "
        "worlds only; iid: a text file's documents dealt to num_clients clients")
    num_clients: int = Field(5, gt=0, description="dirichlet and iid; domain always has 5")
    text_field: str = Field("text", min_length=1, description="iid: the JSONL field or CSV "
                            "column of the text (JSONL also takes prompt + response)")
    lm_window: int = Field(128, ge=8, description="iid: tokens a training or evaluation "
                           "window holds")
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration")
    max_train: int = Field(96, gt=0, description="training questions per client (cap); also "
                           "the most examples a client's reply is weighted by")
    max_test: int = Field(48, gt=0, description="held-out questions per client (cap)")
    niah_length: int = Field(192, gt=0, description="niah: prompt length in tokens of the "
                             "model's tokenizer")
    closed_book_share: float = Field(0.0, ge=0, lt=1, description="niah / openbook: this "
                                     "share of each client's training pairs are closed-book "
                                     "questions (the short-context skill)")

    def __post_init__(self):
        text = is_text_source(self.source)
        if text and self.split != "iid":
            raise PlasticError(f"data.source {self.source} is a text file: its documents are "
                               "split iid (set data.split=iid)")
        if self.split == "iid" and not text:
            raise PlasticError("data.split=iid deals out the documents of a text file (.txt, "
                               f".jsonl, .csv); {self.source!r} is not one (or does not "
                               "exist)")
        if self.closed_book_share and self.split not in ("niah", "openbook"):
            raise PlasticError("data.closed_book_share mixes closed-book questions into niah "
                               f"or openbook clients; the {self.split!r} clients are "
                               "closed-book already: leave it at 0")


@configclass
class MethodConfig:
    """What theta is and what a method adds to the local objective."""

    name: Annotated[str, FEDERATED_METHODS.key] = Field("fednl", description="what theta is and how "
                                              "it trains (fednl/methods/)")
    window: int = Field(64, ge=0, description="attention window in tokens, every method (0 = "
                        "full attention, baselines only): equal O(1) state by default; "
                        "fednl's memory keeps what falls out of the window")
    lora_rank: int = Field(8, gt=0, description="LoRA rank (the memory's q/k/v for fednl, "
                           "the base's q/k/v for the LoRA baselines)")
    lora_alpha: float = Field(16.0, gt=0, description="LoRA scale = lora_alpha / lora_rank")
    fedprox: FedProxConfig = Field(default_factory=FedProxConfig, description="")
    fedala: FedALAConfig = Field(default_factory=FedALAConfig, description="")
    fedssi: FedSSIConfig = Field(default_factory=FedSSIConfig, description="")


@configclass
class MemoryOptions:
    """FedNL's memory branch (ignored by the baselines): the fields of
    :class:`plasticlm.memory.MemoryConfig` under the same names, less those the run sets
    elsewhere (``window``, ``rank`` and ``lora_alpha`` are ``method``'s, shared with the
    baselines) and with ``layers`` as text (``"all"`` before the model is known)."""

    layers: str = Field("all", description="'all' or comma-separated decoder layer indices")
    conv_size: int = Field(4, ge=0, description="short causal convolution on q/k/v (DeltaNet's "
                      "kernel 4); 0 = none")
    gate_init: float = Field(0.0, description="gate logit: 0 gives the memory half of each "
                             "head from the start (at -3 Adam moved it by < 0.1 in a run)")
    mix: Literal["convex", "additive"] = Field("convex", description="how the memory joins "
                                               "the attention, per head")
    memory_norm: bool = Field(False, description="RMS-normalise each head's memory read")
    recurrent: bool = Field(True, description="false removes the recurrence (a control)")
    gate: Literal["head", "input"] = Field("head", description="a gate logit per head, or "
                                           "per head and token from the input")
    decay: bool = Field(False, description="the gated delta rule (the state forgets)")
    lora_scope: Literal["memory", "shared"] = Field("memory", description="LoRA on the memory's "
                                              "q/k/v, or on the q/k/v both branches read")

    def __post_init__(self):
        if self.layers != "all" and not all(
                x.strip().isdigit() for x in self.layers.split(",") if x.strip()):
            raise PlasticError(f"config memory.layers: 'all' or comma-separated layer "
                               f"indices, not {self.layers!r}")


@configclass
class TrainConfig:
    """Rounds and each client's local update."""

    rounds: int = Field(4, gt=0, description="federated rounds")
    local_steps: int = Field(16, gt=0, description="optimizer steps per client and round")
    batch_size: int = Field(8, gt=0, description="training pairs per step")
    lr: float = Field(2e-3, gt=0, description="theta learning rate (LoRA / memory)")
    full_lr: float = Field(2e-4, gt=0, description="fedavg-full: learning rate of all weights")
    gate_lr: float = Field(2e-2, gt=0, description="fednl: lr of the gate logits and beta "
                           "biases (own group): Adam moves a parameter by about lr per step")
    segment_tokens: int = Field(0, ge=0, description="> 0: truncated BPTT, each training "
                                "sequence read in segments of this many tokens, the state "
                                "carried (detached) across them; 0: one forward per sequence")


@configclass
class FederationConfig:
    """The Flower run."""

    min_clients: int = Field(2, gt=0, description="fewer valid replies than this fails the "
                             "round")
    round_timeout: float = Field(900.0, gt=0, description="seconds to wait for replies")
    client_cpus: int = Field(1, gt=0, description="simulation: CPUs (and torch threads) per "
                             "client process; each process holds one frozen base that its "
                             "clients share (2 on 2 cores: one base copy in all)")
    transfer_dtype: Literal["float32", "float16"] = Field("float32", description="what theta "
                                                          "travels as")


@configclass
class AggregationConfig:
    """How the server combines the clients' theta."""

    rule: Annotated[str, AGGREGATORS.key] = Field("mean", description="how the clients' updates "
                                                  "combine (fednl/aggregators.py)")
    clip: float = Field(10.0, ge=0, description="update norm bound, x the round's median "
                        "update norm (0: off)")
    clip_floor: float = Field(0.1, gt=0, description="the least the update norm bound is (L2, "
                              "absolute): a zero-norm majority cannot switch clipping off "
                              "(honest sandbox updates: 0.06-0.23 a round)")
    max_step: float = Field(1.0, gt=0, description="a round whose aggregate moves theta by more "
                            "than this root-mean-square per value, or not finitely, is refused "
                            "and the previous theta kept")
    trim: float = Field(0.2, ge=0, lt=0.5, description="trimmed_mean: share cut at each end")
    server_opt: Annotated[str, SERVER_OPTIMIZERS.key] = Field(
        "none", description="what turns the round's aggregate step into theta's step: 'none' "
        "(FedAvg), 'avgm', 'adam', 'yogi' (Flower's FedAvgM, FedAdam, FedYogi; "
        "fednl/server_opt.py)")
    server_lr: float = Field(1.0, gt=0, description="server learning rate: 1 with 'avgm' is "
                             "FedAvg's step plus momentum; 'adam'/'yogi' move each value by "
                             "about this much a round (Flower's default 0.1 is for whole "
                             "weights; LoRA-sized theta wants ~1e-2)")
    server_momentum: float = Field(0.9, ge=0, lt=1, description="avgm: momentum; adam/yogi: "
                                   "beta_1")
    server_beta2: float = Field(0.99, gt=0, lt=1, description="adam/yogi: beta_2")
    server_tau: float = Field(1e-3, gt=0, description="adam/yogi: tau, the adaptivity floor")


@configclass
class EvalConfig:
    """What is scored during the run."""

    local_eval: Literal["every", "last"] = Field("every", description="rounds whose clients "
                                                 "also score their local model (the "
                                                 "aggregation drop); 'last' saves time")


@configclass
class OutputConfig:
    """Where the run writes."""

    out: str = Field("runs", description="the run folder is out/name")
    client_state_dir: str = Field("", description="where clients keep personal state "
                                  "(default: the run folder's clients/)")
