"""Run folders (``RunDir``, ``metrics.jsonl``, ``clear_run_folder``: marked output folders,
``plasticlm.outputs``), atomic writes, the cache home and the shared data folder: no torch
(torch's side of a run: ``runtime``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from plasticlm.errors import PlasticError
from plasticlm.home import cache_home
from plasticlm.nofollow import write_text
from plasticlm.outputs import atomic_output, prepare_output

__all__ = ["cache_home", "write_text_atomic", "atomic_folder", "clear_run_folder", "RunDir",
           "read_metrics", "shared_data_dir"]


def _jsonable(obj: Any) -> Any:
    """``obj`` as strict JSON values: a non-finite float becomes ``null`` (JSON has no NaN)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    tolist = getattr(obj, "tolist", None)  # NumPy scalars and arrays, torch tensors
    return _jsonable(tolist()) if callable(tolist) else obj


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` beside ``path`` and rename it into place: a crash leaves the old file or
    the new one, never half of one; a link planted at either name is refused or replaced,
    never followed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    write_text(tmp, text)
    os.replace(tmp, path)
    return path


@contextlib.contextmanager
def atomic_folder(folder: str | Path, kind: str = "model") -> Iterator[Path]:
    """A fresh folder beside ``folder`` to write into; when the block ends without error it
    replaces ``folder`` (so a crash never leaves half a model or checkpoint there). Only a
    folder plasticlm wrote (its marker: ``plasticlm.outputs``) is ever replaced.

    >>> with atomic_folder(out) as tmp:          # doctest: +SKIP
    ...     model.save_pretrained(tmp)
    """
    with atomic_output(folder, kind) as tmp:
        yield tmp


def clear_run_folder(folder: str | Path, hint: str) -> Path:
    """Empty ``folder`` for a new run and mark it, but only an earlier run's (it holds
    plasticlm's marker) or an empty one: a mistyped output path must never delete a user's
    folder. Otherwise raises :class:`PlasticError` ending with ``hint``."""
    return prepare_output(folder, "run", fresh=True, hint=hint)


class RunDir:
    """A run folder: ``config.json``, ``metrics.jsonl`` and plots, under ``runs/<name>``.

    >>> run = RunDir.create("demo", config)      # doctest: +SKIP
    >>> run.log(step=1, loss=2.3)                # appends one JSON line
    """

    def __init__(self, path: Path, kind: str = "run"):
        self.path = prepare_output(path, kind)

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
        text = json.dumps(_jsonable(obj), indent=2, allow_nan=False)
        return write_text_atomic(self.path / filename, text + "\n")

    def log(self, **metrics: Any) -> dict:
        """Append one record (with a wall-clock ``time``) to ``metrics.jsonl``."""
        record = {"time": round(time.time(), 3), **_jsonable(metrics)}
        write_text(self.metrics_path, json.dumps(record, allow_nan=False) + "\n", append=True)
        return record

    def metrics(self) -> list[dict]:
        return read_metrics(self.metrics_path)


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` (none when it does not exist). A torn last line (a
    kill during the append) is dropped; a damaged line before it is an error."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = []
    for n, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if n == len(lines):
                break
            raise PlasticError(f"{path}, line {n}: not valid JSON ({e.msg})") from None
    return records


def shared_data_dir() -> Path | None:
    """The real-data folder: ``$PLASTICLM_DATA``, else ``../shared/data`` from the current
    folder or from this checkout; None when absent (nothing requires it)."""
    env = os.environ.get("PLASTICLM_DATA")
    candidates = [Path(env)] if env else []
    candidates += [Path.cwd().parent / "shared" / "data",
                   Path(__file__).resolve().parents[3] / "shared" / "data"]
    return next((p for p in candidates if p.is_dir()), None)
