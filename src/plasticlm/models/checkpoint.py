"""Resumable training: an atomic on-disk checkpoint of weights, optimiser, schedule and step.

Weights go to safetensors; the optimiser's state (tensors and numbers only) to a torch file
read back with ``weights_only=True``. A checkpoint is a folder written beside its final
place and swapped in by renames, so a crash leaves either the previous checkpoint or the new
one, never a torn mix; ``meta.json`` is written last and marks a folder complete.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from plasticlm.errors import PlasticError


@dataclass
class TrainState:
    step: int                      # steps completed
    losses: list[float]


def _complete(folder: Path) -> bool:
    return (folder / "meta.json").is_file()


def save_checkpoint(folder: str | Path, model, optimizer, scheduler, state: TrainState,
                    key: str) -> None:
    """Write the checkpoint of a run identified by ``key`` (e.g. its spec as JSON)."""
    folder = Path(folder)
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
               tmp / "optimizer.pt")
    (tmp / "meta.json").write_text(json.dumps({"key": key, "step": state.step,
                                               "losses": state.losses}) + "\n")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(folder: str | Path, model, optimizer, scheduler, key: str) -> TrainState | None:
    """Restore the newest complete checkpoint of run ``key`` into the given objects; None when
    there is none (or it belongs to another run, which is then ignored)."""
    folder = Path(folder)
    candidates = [folder, folder.with_name(folder.name + ".old"),
                  folder.with_name(folder.name + ".tmp")]
    for c in candidates:
        if not _complete(c):
            continue
        try:
            meta = json.loads((c / "meta.json").read_text())
        except json.JSONDecodeError:
            continue
        if meta.get("key") != key:
            return None
        try:
            load_model(model, str(c / "model.safetensors"))
            opt = torch.load(c / "optimizer.pt", weights_only=True)
        except Exception as e:  # a damaged file: try the older checkpoint
            last_error = e
            continue
        optimizer.load_state_dict(opt["optimizer"])
        scheduler.load_state_dict(opt["scheduler"])
        return TrainState(int(meta["step"]), [float(x) for x in meta["losses"]])
    if any(c.exists() for c in candidates) and "last_error" in locals():
        raise PlasticError(f"checkpoint {folder} is damaged ({last_error}); delete it to start "
                           "over")
    return None


def remove_checkpoint(folder: str | Path) -> None:
    folder = Path(folder)
    for c in (folder, folder.with_name(folder.name + ".old"), folder.with_name(folder.name + ".tmp")):
        shutil.rmtree(c, ignore_errors=True)
