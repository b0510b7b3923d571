"""Resolve a run's model and data, and build a client's trainable model, deterministically."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.methods import get_theta, prepare_model
from plasticlm.fednl.task import ClientTask, client_tasks


def _sandbox_preset(spec: str) -> str | None:
    """"sandbox" -> "sandbox", "sandbox-quick" -> "quick", anything else -> None."""
    if spec == "sandbox":
        return "sandbox"
    if spec.startswith("sandbox-"):
        return spec[len("sandbox-"):]
    return None


def resolve_model_path(spec: str) -> str:
    """``sandbox[-preset]:<name>`` -> the pre-trained sandbox folder; else unchanged."""
    head, _, name = spec.partition(":")
    preset = _sandbox_preset(head) if name else None
    if preset is None:
        return spec
    from plasticlm.data.sandbox import sandbox_model

    return str(sandbox_model(name, preset=preset))


def resolve_data_path(spec: str) -> Path:
    preset = _sandbox_preset(spec)
    if preset is None:
        return Path(spec)
    from plasticlm.data.sandbox import sandbox_world

    return Path(sandbox_world(preset))


@functools.lru_cache(maxsize=4)
def _tasks(cfg_json: str) -> tuple[ClientTask, ...]:
    cfg = FedNLConfig.from_json(cfg_json)
    if cfg.split == "niah":
        from transformers import AutoTokenizer

        from plasticlm.fednl.task import niah_tasks

        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model))
        return tuple(niah_tasks(resolve_data_path(cfg.data), tokenizer, cfg.niah_length,
                                cfg.max_train, cfg.max_test, cfg.seed))
    return tuple(client_tasks(resolve_data_path(cfg.data), cfg.split, cfg.num_clients, cfg.alpha,
                              cfg.max_train, cfg.max_test, cfg.seed))


def tasks_for(cfg: FedNLConfig) -> tuple[ClientTask, ...]:
    """The clients' datasets (cached per process)."""
    return _tasks(cfg.to_json())


def build_model(cfg: FedNLConfig):
    """(model with exactly theta trainable, tokenizer); theta's initial value depends only on
    ``cfg.seed``, so the server and every client start from the same theta."""
    from plasticlm.models import load_causal_lm

    model, tokenizer = load_causal_lm(resolve_model_path(cfg.model), dtype=torch.float32)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = prepare_model(model, cfg.method)
    model.eval()
    return model, tokenizer


@functools.lru_cache(maxsize=2)
def _model(cfg_json: str):
    return build_model(FedNLConfig.from_json(cfg_json))


def model_for(cfg: FedNLConfig):
    """A process-wide model per config: clients share it and overwrite theta per message."""
    return _model(cfg.to_json())


def initial_theta(cfg: FedNLConfig) -> dict[str, torch.Tensor]:
    return get_theta(build_model(cfg)[0])
