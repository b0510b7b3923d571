"""The rows of FedNL's experiments: which method at which attention window (or which control),
the experiment's sizes, and the Flower run that trains each row's theta."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from plasticlm.errors import PlasticError
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.methods import MethodConfig
from plasticlm.fednl.run import run_federated
from plasticlm.fednl.setup import build_model
from plasticlm.fednl.task import has_closed_book_pool
from plasticlm.fednl.theta import set_theta
from plasticlm.runs import clear_run_folder, load_tensors

log = logging.getLogger("plasticlm.fednl")

EXPERIMENTS = ("mmlu", "niah", "openbook", "stream", "memory", "comm")


@dataclass(frozen=True)
class Variant:
    """One row: a method at an attention window (0 = full), or a control."""

    label: str
    method: str
    window: int
    recurrent: bool = True
    trained: bool = True
    decay: bool = False           # fednl: the gated delta rule
    closed_book: bool = False     # clients also train on closed-book questions
                                  # (ExperimentConfig.closed_book_share of their pairs)

    @property
    def key(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.label).strip("-")


@dataclass
class ExperimentConfig:
    """Sizes of ``plasticlm fednl experiment`` (loadable from TOML/YAML, ``--set`` overrides)."""

    experiment: str = "niah"
    seeds: int = 3
    window: int = 16              # beyond-window experiments: W in tokens
    rounds: int = 3
    local_steps: int = 12
    batch_size: int = 8
    max_train: int = 48           # per client
    max_test: int = 48            # per client
    niah_length: int = 160        # tokens per NIAH sample (10 W; multikey needs >= 160)
    lr: float = 2e-3
    segment_tokens: int = 0       # > 0: windowed rows train in segments of this many tokens,
                                  # the state carried across them (truncated BPTT)
    closed_book_share: float = 0.25  # the "with closed-book questions" row: their share of
                                     # each client's training pairs
    model: str = "sandbox:receiver"
    data: str = "sandbox"
    out: str = "runs/fednl-experiments"
    memory_tokens: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384])
    bucket_tokens: int = 256      # stream: CE bucket
    stream_tokens: int = 0        # stream: > 0 reads this many tokens per client, its own
                                  # stream continued by the other domains' (0: its own only)
    stream_questions: bool = True # stream: answer the in-stream questions where they stand
    stream_from: str = "openbook" # stream: whose runs' thetas read the streams (openbook | niah)
    rows: tuple[str, ...] = ()    # which variants run, by label (empty: all); the reference
                                  # "fedavg LoRA, window" always does

    def __post_init__(self):
        if self.experiment not in EXPERIMENTS:
            raise PlasticError(f"unknown experiment {self.experiment!r}; choose one of "
                               f"{', '.join(EXPERIMENTS)} (or 'all')")
        if self.stream_from not in ("openbook", "niah"):
            raise PlasticError(f"stream_from must be 'openbook' or 'niah', not "
                               f"{self.stream_from!r}")
        if self.seeds < 1 or self.rounds < 1 or self.window < 1:
            raise PlasticError("seeds, rounds and window must be >= 1")
        if not 0 < self.closed_book_share < 1:
            raise PlasticError(f"closed_book_share must be in (0, 1), not "
                               f"{self.closed_book_share}")
        if self.stream_tokens and self.stream_tokens < self.bucket_tokens:
            raise PlasticError(f"stream_tokens must be 0 (each domain's own stream) or at least "
                               f"one bucket ({self.bucket_tokens}), not {self.stream_tokens}")
        if self.stream_tokens and self.stream_questions:
            raise PlasticError("in-stream questions are asked in a domain's own stream; with "
                               "stream_tokens > 0 also set stream_questions=false")


def variants(cfg: ExperimentConfig) -> list[Variant]:
    """The experiment's rows (``cfg.rows`` of them, and the windowed FedAvg reference)."""
    every = _all_variants(cfg)
    if not cfg.rows:
        return every
    unknown = set(cfg.rows) - {v.label for v in every}
    if unknown:
        raise PlasticError(f"unknown rows {sorted(unknown)} for {cfg.experiment}; choose from "
                           f"{[v.label for v in every]}")
    return [v for v in every if v.label in cfg.rows or v.label == "fedavg LoRA, window"]


def _all_variants(cfg: ExperimentConfig) -> list[Variant]:
    w = cfg.window
    if cfg.experiment == "mmlu":
        w = 64  # every item fits: a closed-book test of the method, not of the window
        return [Variant("fednl", "fednl", w), Variant("fedavg LoRA, window", "fedavg", w),
                Variant("fedprox", "fedprox", w), Variant("fedssi", "fedssi", w),
                Variant("fedala", "fedala", w),
                Variant("untrained", "fedavg", w, trained=False)]
    # the closed-book row needs closed-book questions: not in a folder of NIAH essays
    book = ([Variant("fednl, with closed-book questions", "fednl", w, closed_book=True)]
            if has_closed_book_pool(cfg.data) else [])
    return [Variant("fednl", "fednl", w),
            Variant("fednl, decay", "fednl", w, decay=True),
            *book,
            Variant("fednl, recurrence removed", "fednl", w, recurrent=False),
            Variant("fedavg LoRA, window", "fedavg", w),
            Variant("fedavg LoRA, full attention", "fedavg", 0),
            Variant("untrained, window", "fedavg", w, trained=False)]


def federated_config(cfg: ExperimentConfig, v: Variant, seed: int, root: Path) -> FedNLConfig:
    # memory and comm need no client data to train on; they measure the mmlu clients' model
    split = {"niah": "niah", "openbook": "openbook"}.get(cfg.experiment, "domain")
    method = MethodConfig(name=v.method, window=v.window, memory_recurrent=v.recurrent,
                          memory_decay=v.decay,
                          local_steps=cfg.local_steps, batch_size=cfg.batch_size, lr=cfg.lr,
                          segment_tokens=cfg.segment_tokens if v.window else 0)
    return FedNLConfig(name=f"{v.key}-s{seed}", model=cfg.model, data=cfg.data, split=split,
                       max_train=cfg.max_train, max_test=cfg.max_test,
                       niah_length=cfg.niah_length,
                       closed_book_share=cfg.closed_book_share if v.closed_book else 0.0,
                       rounds=cfg.rounds, seed=seed,
                       min_clients=1, local_eval="last", out=str(root), method=method)


def trained_model(fcfg: FedNLConfig, trained: bool, progress: bool = True):
    """(model with the final global theta of ``fcfg``'s Flower run, tokenizer, summary); the
    run is reused when its folder holds a finished run of the same config."""
    model, tok = build_model(fcfg)
    if not trained:
        return model, tok, None
    run_dir = Path(fcfg.out) / fcfg.name
    # the saved config is read back through the dataclass, so a run written before a field
    # existed matches when the new field holds its default
    done = (run_dir / "summary.json").exists() and (run_dir / "config.json").exists() and \
        FedNLConfig.from_json((run_dir / "config.json").read_text()).to_json() == fcfg.to_json()
    if not done:
        if progress:
            log.info("%s: %d rounds on Flower", fcfg.name, fcfg.rounds)
        clear_run_folder(run_dir, "choose another --set out=...")
        run_federated(fcfg)
    theta = load_tensors(sorted(run_dir.glob("round_*/theta.safetensors"))[-1], "FedNL theta")
    set_theta(model, theta)
    return model, tok, json.loads((run_dir / "summary.json").read_text())
