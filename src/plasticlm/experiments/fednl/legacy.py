"""Experiment configs saved before the run config was nested (``results.json`` of earlier
versions, such as the committed ``bench/results/fednl_experiments/*.json``), read into
today's :class:`ExperimentConfig` so their tables render again."""

from __future__ import annotations

from typing import Any

from plasticlm.config import deep_update, from_dict
from plasticlm.experiments.fednl.variants import ExperimentConfig

# old flat key -> today's dotted key
_MOVED = {"window": "run.method.window", "rounds": "run.train.rounds",
          "local_steps": "run.train.local_steps", "batch_size": "run.train.batch_size",
          "lr": "run.train.lr", "segment_tokens": "run.train.segment_tokens",
          "max_train": "run.data.max_train", "max_test": "run.data.max_test",
          "niah_length": "run.data.niah_length", "model": "run.model",
          "data": "run.data.source", "closed_book_share": "closed_book_row_share"}


def experiment_config(saved: dict[str, Any]) -> ExperimentConfig:
    """``saved`` (today's nested form, or the flat one of earlier versions) as a config."""
    if "run" in saved or not any(k in saved for k in _MOVED):
        return from_dict(ExperimentConfig, saved)
    tree: dict = {}
    for key, value in saved.items():
        *parents, last = _MOVED.get(key, key).split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return from_dict(ExperimentConfig, deep_update({}, tree))
