"""Per-round checkpoints of a federated run, and the clients' own personal-state files.

A round is committed only after its evaluation: ``round_<r>/theta.safetensors`` is written,
then the round's record is appended to ``metrics.jsonl``, then ``checkpoint.json`` is
replaced atomically to point at round r. A run killed at any moment resumes from the last
committed round and repeats exactly the rounds after it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from plasticlm.data.jsonl import read_jsonl
from plasticlm.errors import PlasticError
from plasticlm.runs import load_tensors, write_text_atomic


class Checkpointer:
    """The server's side: global theta and metrics after each finished round."""

    def __init__(self, run_dir: Path, cfg):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.pointer = self.run_dir / "checkpoint.json"
        self.metrics = self.run_dir / "metrics.jsonl"
        self.client_state_dir = cfg.client_state_dir or str(self.run_dir / "clients")

    def committed_round(self) -> int:
        if not self.pointer.exists():
            return 0
        return int(json.loads(self.pointer.read_text())["round"])

    def latest(self, initial: dict[str, torch.Tensor]) -> tuple[int, dict[str, torch.Tensor]]:
        """(last committed round, its global theta), or (0, ``initial``); drops any metrics
        lines written after the committed round (a kill between the two writes)."""
        r = self.committed_round()
        records = self.records()
        kept = [x for x in records if x["round"] <= r]
        if len(kept) != len(records):
            write_text_atomic(self.metrics, "".join(json.dumps(x) + "\n" for x in kept))
        if r == 0:
            return 0, initial
        path = self.run_dir / f"round_{r:04d}" / "theta.safetensors"
        if not path.exists():
            raise PlasticError(f"{self.pointer} points at round {r} but {path} is missing; "
                               "the run folder is damaged: start a fresh run")
        return r, load_tensors(path, "FedNL checkpoint")

    def commit(self, round_: int, theta: dict[str, torch.Tensor], record: dict) -> None:
        folder = self.run_dir / f"round_{round_:04d}"
        folder.mkdir(exist_ok=True)
        save_file({k: v.contiguous() for k, v in theta.items()}, str(folder / "theta.safetensors"))
        with self.metrics.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        write_text_atomic(self.pointer, json.dumps({"round": round_}) + "\n")
        previous = self.run_dir / f"round_{round_ - 1:04d}"
        if previous.exists():  # keep the latest round only; theta per round is in metrics
            shutil.rmtree(previous)

    def records(self) -> list[dict]:
        if not self.metrics.exists():
            return []
        return [obj for _, obj in read_jsonl(self.metrics, "metrics")]


def save_client_state(folder: Path, round_: int, state: dict[str, torch.Tensor]) -> None:
    """A client's personal tensors after ``round_``, on the client's own disk."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".state_{round_:04d}.tmp"
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp))
    os.replace(tmp, folder / f"state_{round_:04d}.safetensors")


def load_client_state(folder: Path, round_: int) -> dict[str, torch.Tensor]:
    """The client's personal tensors as they were after ``round_`` (empty when none)."""
    path = folder / f"state_{round_:04d}.safetensors"
    return load_tensors(path, "FedNL checkpoint") if path.exists() else {}
