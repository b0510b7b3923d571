"""Seeding, run folders, device selection and the cache home."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) so a run repeats exactly on CPU."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def pick_device(device: str | None = None) -> torch.device:
    """``device`` if given, else CUDA when present, else CPU."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cache_home() -> Path:
    """Where models and generated data live: ``$PLASTICLM_HOME`` or ``~/.cache/plasticlm``."""
    home = os.environ.get("PLASTICLM_HOME")
    path = Path(home) if home else Path.home() / ".cache" / "plasticlm"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    return obj


class RunDir:
    """A run folder: ``config.json``, ``metrics.jsonl`` and plots, under ``runs/<name>``.

    >>> run = RunDir.create("demo", config)      # doctest: +SKIP
    >>> run.log(step=1, loss=2.3)                # appends one JSON line
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    @classmethod
    def create(cls, name: str, config: Any = None, root: str | Path = "runs") -> RunDir:
        run = cls(Path(root) / name)
        if config is not None:
            run.write_json("config.json", config)
        return run

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    def write_json(self, filename: str, obj: Any) -> Path:
        path = self.path / filename
        path.write_text(json.dumps(_jsonable(obj), indent=2) + "\n")
        return path

    def log(self, **metrics: Any) -> dict:
        """Append one record (with a wall-clock ``time``) to ``metrics.jsonl``."""
        record = {"time": round(time.time(), 3), **_jsonable(metrics)}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return record

    def metrics(self) -> list[dict]:
        if not self.metrics_path.exists():
            return []
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line]


def shared_data_dir() -> Path | None:
    """The real-data folder: ``$PLASTICLM_DATA``, else ``../shared/data`` from the current
    folder or from this checkout; None when absent (nothing requires it)."""
    env = os.environ.get("PLASTICLM_DATA")
    candidates = [Path(env)] if env else []
    candidates += [Path.cwd().parent / "shared" / "data",
                   Path(__file__).resolve().parents[3] / "shared" / "data"]
    return next((p for p in candidates if p.is_dir()), None)
