"""The rows of FedNL's experiments: which method at which attention window (or which control),
the experiment's sizes, and the Flower run that trains each row's theta."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from plasticlm.config import Field, configclass, override
from plasticlm.errors import PlasticError
from plasticlm.experiments.fednl.central_yardstick import finished_run, train_central
from plasticlm.experiments.rows import kept, load_rows, resolve, rows_path
from plasticlm.fednl.build import build_model
from plasticlm.fednl.clients import has_closed_book_pool
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.config_sections import (
    DataConfig,
    EvalConfig,
    FederationConfig,
    MethodConfig,
    TrainConfig,
)
from plasticlm.fednl.flower.checkpoint import client_state_root, load_client_state
from plasticlm.fednl.registries import FEDERATED_METHODS
from plasticlm.fednl.run import run_federated
from plasticlm.fednl.theta import set_theta
from plasticlm.runs import clear_run_folder
from plasticlm.tensor_files import load_tensors

log = logging.getLogger("plasticlm.fednl")

EXPERIMENTS = ("mmlu", "niah", "openbook", "stream", "memory", "comm")
# the experiments scored row by row (stream reads the rows of its stream_from runs)
ROW_EXPERIMENTS = ("mmlu", "niah", "openbook")
# the split each experiment's clients are built with (memory and comm measure mmlu's clients)
SPLITS = {"niah": "niah", "openbook": "openbook"}
# the federated baselines the paper compares FedNL against (windowed LoRA, as FedAvg)
PAPER_BASELINES = ("fedprox", "fedala", "fedssi")
# issue 41's yardstick: the same theta trained centrally on the clients' data pooled
CENTRAL = "fednl, central (pooled)"
# the nested split: scored per client with its own gate (client_theta)
PERSONAL_GATE = "fednl, personal gate"


@dataclass(frozen=True)
class Variant:
    """One row: overrides of the experiment's base run config (dotted keys), or a control
    (``trained=False``: the base model as prepared, never trained), or the yardstick
    (``central=True``: theta trained centrally on the clients' data pooled,
    :mod:`plasticlm.experiments.fednl.central_yardstick`); ``window`` is the row's resolved attention window, for
    its tables."""

    label: str
    changes: tuple[tuple[str, Any], ...] = ()
    trained: bool = True
    window: int = 0
    central: bool = False

    @property
    def key(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.label).strip("-")


def _experiment_run() -> FedNLConfig:
    """The experiments' base run: short runs, one valid reply suffices, local scores last."""
    return FedNLConfig(
        data=DataConfig(max_train=48, max_test=48, niah_length=160),
        method=MethodConfig(window=16),
        train=TrainConfig(rounds=3, local_steps=12, batch_size=8, lr=2e-3),
        federation=FederationConfig(min_clients=1),
        eval=EvalConfig(local_eval="last"))


@configclass
class ExperimentConfig:
    """``plasticlm fednl experiment``: which experiment, over how many seeds, and the base run
    config every row overrides (``--set run.train.rounds=5``, ``run.aggregation.rule=median``)."""

    experiment: Literal["mmlu", "niah", "openbook", "stream", "memory", "comm"] = Field(
        "niah", description="the paper's experiment")
    seeds: int = Field(3, gt=0, description="seeds of every row")
    rows: tuple[str, ...] = Field((), description="which rows run, by label (empty: all); the "
                                  "reference 'fedavg LoRA, window' always does")
    closed_book_row_share: float = Field(0.25, gt=0, lt=1, description="the 'with "
                                         "closed-book questions' row: their share of each "
                                         "client's training pairs (its data.closed_book_share)")
    out: str = Field("runs/fednl-experiments", description="results go to out/EXPERIMENT/")
    memory_tokens: tuple[int, ...] = Field((1024, 2048, 4096, 8192, 16384), description=
                                           "memory: stream lengths measured")
    bucket_tokens: int = Field(256, gt=0, description="stream: CE bucket")
    stream_tokens: int = Field(0, ge=0, description="stream: > 0 reads this many tokens per "
                               "client, its own stream continued by the other domains' (0: "
                               "its own only)")
    stream_questions: bool = Field(True, description="stream: answer the in-stream questions "
                                   "where they stand")
    stream_from: Literal["openbook", "niah"] = Field("openbook", description="stream: whose "
                                                     "runs' thetas read the streams")
    rows_file: str = Field("", description="a TOML file of [[row]] tables (a label and "
                           "dotted overrides of run) to run instead of the packaged "
                           "configs/experiments/fednl/<experiment>.toml")
    run: FedNLConfig = Field(default_factory=_experiment_run, description="")

    def __post_init__(self):
        if self.stream_tokens and self.stream_tokens < self.bucket_tokens:
            raise PlasticError(f"stream_tokens must be 0 (each domain's own stream) or at least "
                               f"one bucket ({self.bucket_tokens}), not {self.stream_tokens}")
        if self.stream_tokens and self.stream_questions:
            raise PlasticError("in-stream questions are asked in a domain's own stream; with "
                               "stream_tokens > 0 also set stream_questions=false")
        if self.run.method.window < 1:
            raise PlasticError("the experiments compare rows at an attention window: "
                               "run.method.window must be >= 1")
        if self.rows_file or self.experiment in ROW_EXPERIMENTS:
            load_rows(_rows_file(self), CONDITIONS)     # a bad row is refused at load


def variants(cfg: ExperimentConfig) -> list[Variant]:
    """The experiment's rows (``cfg.rows`` of them, and the windowed FedAvg reference)."""
    every = [dataclasses.replace(v, window=_resolved(cfg, v).method.window)
             for v in _all_variants(cfg)]
    if not cfg.rows:
        return every
    unknown = set(cfg.rows) - {v.label for v in every}
    if unknown:
        raise PlasticError(f"unknown rows {sorted(unknown)} for {cfg.experiment}; choose from "
                           f"{[v.label for v in every]}")
    return [v for v in every if v.label in cfg.rows or v.label == "fedavg LoRA, window"]


CONDITIONS = ("closed_book_pool",)


def _rows_file(cfg: ExperimentConfig) -> Path:
    return Path(cfg.rows_file) if cfg.rows_file else rows_path("fednl", cfg.experiment)


def _all_variants(cfg: ExperimentConfig) -> list[Variant]:
    """The rows of ``configs/experiments/fednl/<experiment>.toml`` (or ``cfg.rows_file``),
    resolved against the base run; the closed-book row only where the data source has
    closed-book questions (not in a folder of NIAH essays)."""
    def holds(condition: str) -> bool:
        return has_closed_book_pool(cfg.run.data.source)
    rows = kept(load_rows(_rows_file(cfg), CONDITIONS), holds)
    return [Variant(r.label, resolve(r, cfg.run, cfg), r.trained, central=r.central)
            for r in rows]


def _resolved(cfg: ExperimentConfig, v: Variant) -> FedNLConfig:
    return override(cfg.run, {**dict(v.changes),
                              "data.split": SPLITS.get(cfg.experiment, "domain")})


def federated_config(cfg: ExperimentConfig, v: Variant, seed: int, root: Path) -> FedNLConfig:
    """Row ``v``'s run config: the base run with the row's overrides, its seed and folder."""
    return override(_resolved(cfg, v), {"name": f"{v.key}-s{seed}", "seed": seed,
                                        "outputs.out": str(root)})


def trained_model(fcfg: FedNLConfig, trained: bool, progress: bool = True,
                  central: bool = False):
    """(model with the final global theta of ``fcfg``'s Flower run, tokenizer, summary), or
    with ``central`` the theta of its central pooled run; the run is reused when its folder
    holds a finished run of the same config."""
    model, tok = build_model(fcfg)
    if not trained:
        return model, tok, None
    if central:
        return model, tok, train_central(fcfg, model, tok, progress)
    run_dir = Path(fcfg.outputs.out) / fcfg.name
    if not finished_run(run_dir, fcfg):
        if progress:
            log.info("%s: %d rounds on Flower", fcfg.name, fcfg.train.rounds)
        clear_run_folder(run_dir, "choose another --set out=...")
        run_federated(fcfg)
    theta = load_tensors(sorted(run_dir.glob("round_*/theta.safetensors"))[-1], "FedNL theta")
    set_theta(model, theta)
    return model, tok, json.loads((run_dir / "summary.json").read_text())


def client_theta(fcfg: FedNLConfig, pid: int, global_theta: dict) -> dict:
    """The theta client ``pid`` of ``fcfg``'s finished Flower run answers with: the global
    theta, with the client's own share from its state after the last round where the method
    keeps one (``fednl-personal``'s gate)."""
    folder = Path(client_state_root(fcfg, Path(fcfg.outputs.out) / fcfg.name)) / f"client{pid}"
    return FEDERATED_METHODS[fcfg.method.name]().personalise(
        global_theta, load_client_state(folder, fcfg.train.rounds))
