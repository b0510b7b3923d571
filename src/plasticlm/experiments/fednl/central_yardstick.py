"""The yardstick of a federated row: the same theta trained centrally on every client's data
pooled, with the federation's total number of optimiser steps.

A federation of C clients running R rounds of S local steps takes R x S x C steps of batch B
in all; the central run takes them one after another, with one optimiser, sampling the pooled
pairs uniformly (each client's share of the pool is its share of the data). What the
federated row loses against it is what averaging tasks costs, not a smaller budget.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from safetensors.torch import save_file

from plasticlm.config import override, read_saved_config, save_config
from plasticlm.errors import PlasticError
from plasticlm.fednl.build import tasks_for
from plasticlm.fednl.config import FedNLConfig
from plasticlm.fednl.local_round import local_update
from plasticlm.fednl.task import ClientTask
from plasticlm.fednl.theta import get_theta, set_theta
from plasticlm.runs import clear_run_folder
from plasticlm.tensor_files import load_tensors

log = logging.getLogger("plasticlm.fednl")


def pooled_task(tasks: tuple[ClientTask, ...] | list[ClientTask]) -> ClientTask:
    """One task holding every client's training items and closed-book questions (no test
    items: each client's own test set scores the result)."""
    if not tasks or len({type(t) for t in tasks}) != 1:
        raise PlasticError("pooling needs clients of one kind")
    return dataclasses.replace(tasks[0], name="pooled", domain="pooled",
                               train=[x for t in tasks for x in t.train], test=[],
                               closed_book=[q for t in tasks for q in t.closed_book])


def central_steps(cfg: FedNLConfig, clients: int) -> int:
    """The federation's total optimiser steps: rounds x local steps x clients."""
    return cfg.train.rounds * cfg.train.local_steps * clients


def train_central(cfg: FedNLConfig, model, tokenizer, progress: bool = True) -> dict:
    """Train ``model``'s theta (as built, ``cfg.seed``'s initial theta) on the pooled clients
    of ``cfg`` and leave it set; returns the summary. The run folder ``out/name`` keeps
    ``theta.safetensors``, ``config.json`` and ``summary.json``; a finished run of the same
    config is loaded instead of trained again."""
    run_dir = Path(cfg.outputs.out) / cfg.name
    if finished_run(run_dir, cfg):
        set_theta(model, load_tensors(run_dir / "theta.safetensors", "central theta"))
        return json.loads((run_dir / "summary.json").read_text())
    clear_run_folder(run_dir, "choose another --set out=...")
    save_config(cfg, run_dir)
    tasks = tasks_for(cfg)
    steps = central_steps(cfg, len(tasks))
    if progress:
        log.info("%s: %d central steps on %d clients' data pooled", cfg.name, steps, len(tasks))
    t0 = time.time()
    _, metrics = local_update(model, tokenizer, pooled_task(tasks), get_theta(model), {},
                              override(cfg, {"train.local_steps": steps}), cfg.seed)
    theta = get_theta(model)  # all of it: nothing stays on a client when training is central
    save_file({k: v.contiguous() for k, v in theta.items()}, str(run_dir / "theta.safetensors"))
    summary = {"central_steps": steps, "seconds": round(time.time() - t0, 1), **metrics}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def finished_run(run_dir: Path, cfg: FedNLConfig) -> bool:
    """Whether ``run_dir`` holds a finished run (its ``summary.json``, written last) of
    exactly ``cfg``: a federated or central run that can be loaded instead of trained."""
    return (run_dir / "summary.json").exists() and saved_run_config(run_dir) == cfg


def saved_run_config(run_dir: Path) -> FedNLConfig | None:
    """The run folder's config, or None when it has none this version reads."""
    try:
        return read_saved_config(FedNLConfig, run_dir)
    except PlasticError:
        return None
