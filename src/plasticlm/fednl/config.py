"""The run config of FedNL (and its baselines): one frozen, nested, validated tree.

Sections: ``data`` (whose clients), ``method`` (what theta is), ``memory`` (FedNL's memory
branch), ``train`` (rounds and each client's local update), ``federation`` (the Flower run),
``aggregation`` (how the server combines theta), ``eval`` and ``outputs``. Every field is
read from here and nowhere else; the resolved tree is saved as ``config.json`` in the run
folder, travels to the clients once per run as Flower's run config (:func:`flower_run_config`)
and is what ``--resume`` checks against.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any, ClassVar

from plasticlm.config import Field, configclass, from_dict, to_dict
from plasticlm.errors import PlasticError
from plasticlm.fednl import aggregators, methods, server_opt  # noqa: F401 - they register
from plasticlm.fednl.config_sections import (
    AggregationConfig,
    DataConfig,
    EvalConfig,
    FederationConfig,
    MemoryOptions,
    MethodConfig,
    OutputConfig,
    TrainConfig,
)
from plasticlm.fednl.privacy import PrivacyConfig, privacy_problem
from plasticlm.fednl.registries import FEDERATED_METHODS
from plasticlm.outputs import check_folder_name


@configclass
class FedNLConfig:
    """Everything a federated run needs."""

    # the flat method knobs of earlier versions, now each method's own config (run folders
    # saved before the moves still resume)
    RENAMED_KEYS: ClassVar[dict[str, str]] = {
        "method.prox_mu": "method.fedprox.mu",
        "method.ala_layers": "method.fedala.layers",
        "method.ala_steps": "method.fedala.steps",
        "method.ala_lr": "method.fedala.lr",
        "method.si_c": "method.fedssi.c",
        "method.si_xi": "method.fedssi.xi",
        "method.si_mix": "method.fedssi.mix",
        # and the memory section's names, now MemoryConfig's
        "memory.conv": "memory.conv_size",
        "memory.norm": "memory.memory_norm",
        "memory.lora": "memory.lora_scope",
    }

    name: str = Field("fednl-sandbox", description="the run's folder name under outputs.out")
    seed: int = Field(0, ge=0, description="data split, initial theta and sampling")
    model: str = Field("sandbox:receiver", description="'<preset>:<model>' (sandbox, quick), "
                       "'shape:<name>[@layers]', an HF folder or a hub id")
    data: DataConfig = Field(default_factory=DataConfig, description="")
    method: MethodConfig = Field(default_factory=MethodConfig, description="")
    memory: MemoryOptions = Field(default_factory=MemoryOptions, description="")
    train: TrainConfig = Field(default_factory=TrainConfig, description="")
    federation: FederationConfig = Field(default_factory=FederationConfig, description="")
    aggregation: AggregationConfig = Field(default_factory=AggregationConfig, description="")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="")
    outputs: OutputConfig = Field(default_factory=OutputConfig, description="")
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig, description="")

    def __post_init__(self):
        # the run folder is out/name: an empty name would make it `out` itself
        check_folder_name(self.name, "config name")
        if self.train.segment_tokens and self.method.window == 0:
            raise PlasticError("train.segment_tokens carries a windowed state across "
                               "segments: use method.window > 0")
        if FEDERATED_METHODS[self.method.name].memory and self.method.window == 0:
            raise PlasticError("fednl needs an attention window (method.window > 0): the "
                               "memory holds what falls out of it")
        problem = privacy_problem(self.privacy, self.aggregation.rule, self.aggregation.clip,
                                  server_opt=self.aggregation.server_opt)
        if problem:
            raise PlasticError(problem)

    def gate_warning(self) -> str | None:
        """A warning when the training budget cannot move fednl's gate logits by 1 (Adam
        moves a parameter by at most about lr per step), else None."""
        if not FEDERATED_METHODS[self.method.name].memory:
            return None
        t = self.train
        reach = t.gate_lr * t.local_steps * t.rounds
        if reach >= 1.0:
            return None
        alpha = 1 / (1 + math.exp(-self.memory.gate_init))
        return (f"the gate can move by at most ~{reach:.2f} in logit over {t.rounds} rounds x "
                f"{t.local_steps} steps at gate_lr={t.gate_lr}: alpha will stay near "
                f"sigmoid({self.memory.gate_init})={alpha:.3f}; raise train.gate_lr or the "
                "steps")

    def to_json(self) -> str:
        return json.dumps(to_dict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FedNLConfig:
        return from_dict(cls, json.loads(text))


def flower_run_config(cfg: FedNLConfig) -> dict[str, Any]:
    """``cfg`` as Flower's run config: dotted keys, scalar values (what ``flwr run
    --run-config`` and ``[tool.flwr.app.config]`` take)."""
    flat: dict[str, Any] = {}

    def walk(tree: dict, prefix: str) -> None:
        for k, v in tree.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                flat[prefix + k] = v
    walk(to_dict(cfg), "")
    return flat


# Flower run-config keys that are the app's own, not FedNLConfig's
RUN_DIR_KEY = "run-dir"


def from_flower_run_config(run_config: dict[str, Any]) -> FedNLConfig:
    """The run config back from Flower's dotted keys."""
    tree: dict = {}
    for key, value in run_config.items():
        if key == RUN_DIR_KEY:
            continue
        node = tree
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return from_dict(FedNLConfig, tree)


@functools.lru_cache(maxsize=8)
def _config_of(items: tuple) -> FedNLConfig:
    return from_flower_run_config(dict(items))


def run_of(context) -> tuple[FedNLConfig, Path]:
    """(config, run folder) of the run a Flower ``Context`` belongs to, read once per run and
    process from its run config."""
    rc = dict(context.run_config)
    cfg = _config_of(tuple(sorted(rc.items())))
    run_dir = Path(str(rc.get(RUN_DIR_KEY) or Path(cfg.outputs.out) / cfg.name))
    return cfg, run_dir


def app_config(cfg: FedNLConfig | None = None, run_dir: str | Path = "") -> dict:
    """Flower's run config of ``cfg`` (nested tables, flattened by Flower to dotted keys) and
    its run folder; with no ``cfg``, the app's ``[tool.flwr.app.config]`` of defaults."""
    return {**to_dict(cfg or FedNLConfig()), RUN_DIR_KEY: str(run_dir)}
