"""Every ``metrics.jsonl`` under a run folder as TensorBoard scalars, one TensorBoard run per
file (``plasticlm report RUN_DIR --tensorboard``). Written after the fact from the records,
so every writer of metrics (FedNL rounds, SCoL outer steps, pre-training, the demo) shows
up without logging twice."""

from __future__ import annotations

import math
from pathlib import Path

from plasticlm.errors import PlasticError
from plasticlm.outputs import prepare_output
from plasticlm.runs import read_metrics

STEP_KEYS = ("round", "step", "outer_step", "epoch")


def scalars(record: dict, prefix: str = "") -> dict[str, float]:
    """The finite numbers of a record, nested keys joined by ``/`` (``time`` is the wall
    clock, not a metric)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        tag = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalars(value, f"{tag}/"))
        elif (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value) and tag != "time"):
            out[tag] = float(value)
    return out


def step_of(record: dict, index: int) -> int:
    """The record's own step (round, step, ...) when it has one, else its position."""
    for key in STEP_KEYS:
        if isinstance(record.get(key), int) and not isinstance(record[key], bool):
            return record[key]
    return index


def export_tensorboard(run_dir: str | Path, logdir: str | Path | None = None
                       ) -> tuple[Path, int]:
    """Write TensorBoard event files for every ``metrics.jsonl`` under ``run_dir`` into
    ``logdir`` (default ``run_dir/tensorboard``); returns it and the scalars written."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise PlasticError("TensorBoard export needs the tensorboard package: pip install "
                           "tensorboard (or pip install 'plasticlm[tensorboard]')") from None
    run_dir = Path(run_dir)
    files = sorted(run_dir.rglob("metrics.jsonl"))
    if not files:
        raise PlasticError(f"{run_dir} holds no metrics.jsonl; give a folder a plasticlm "
                           "command wrote")
    logdir = prepare_output(Path(logdir) if logdir else run_dir / "tensorboard", "tensorboard",
                            hint="give another --tensorboard LOGDIR")
    written = 0
    for path in files:
        rel = path.parent.relative_to(run_dir)
        writer = SummaryWriter(str(logdir / rel if str(rel) != "." else logdir / run_dir.name))
        for i, record in enumerate(read_metrics(path)):
            for tag, value in scalars(record).items():
                writer.add_scalar(tag, value, step_of(record, i), walltime=record.get("time"))
                written += 1
        writer.close()
    return logdir, written
