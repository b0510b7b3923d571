"""Resolve a run's model and data, and build a client's trainable model, deterministically."""

from __future__ import annotations

import functools

import torch
from transformers import AutoTokenizer

from plasticlm.fednl.clients import (
    client_tasks,
    niah_tasks,
    openbook_tasks,
    text_tasks,
    with_closed_book,
)
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.methods import prepare_model
from plasticlm.fednl.task import ClientTask
from plasticlm.fednl.theta import get_theta
from plasticlm.models import load_causal_lm
from plasticlm.models.specs import resolve_data, resolve_model


@functools.lru_cache(maxsize=4)
def _tasks(cfg_json: str) -> tuple[ClientTask, ...]:
    cfg = FedNLConfig.from_json(cfg_json)
    d = cfg.data
    source = resolve_data(d.source)
    if d.split == "niah":
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.model))
        tasks = niah_tasks(source, tokenizer, d.niah_length, d.max_train, d.max_test, cfg.seed)
        return tuple(with_closed_book(tasks, source, d.closed_book_share, cfg.seed))
    if d.split == "openbook":
        tasks = openbook_tasks(source, d.max_train, d.max_test, cfg.seed)
        return tuple(with_closed_book(tasks, source, d.closed_book_share, cfg.seed))
    if d.split == "iid":
        return tuple(text_tasks(source, d.num_clients, d.max_train, d.max_test, cfg.seed,
                                d.text_field, d.lm_window))
    return tuple(client_tasks(source, d.split, d.num_clients, d.alpha, d.max_train, d.max_test,
                              cfg.seed))


def tasks_for(cfg: FedNLConfig) -> tuple[ClientTask, ...]:
    """The clients' datasets (cached per process)."""
    return _tasks(cfg.to_json())


def build_model(cfg: FedNLConfig):
    """(model with exactly theta trainable, tokenizer) on the run's device and in its dtype
    (theta itself stays float32); theta's initial value depends only on ``cfg.seed``, so the
    server and every client start from the same theta."""
    model, tokenizer = load_causal_lm(resolve_model(cfg.model))
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = prepare_model(model, cfg.method, cfg.memory)
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
