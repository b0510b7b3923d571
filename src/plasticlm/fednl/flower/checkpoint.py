"""Per-round checkpoints of a federated run, and the clients' own personal-state files.

A round is committed only after its evaluation: ``round_<r>/theta.safetensors`` is written
(atomically), then the round's record is appended to ``metrics.jsonl``, then
``checkpoint.json`` is replaced atomically to point at round r. The last two rounds are kept:
a run killed at any moment resumes from the last committed round, or from the one before
when the last one's theta is damaged, and repeats exactly the rounds after it; a torn last
line of ``metrics.jsonl`` (a kill in the middle of the append) is dropped.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from plasticlm.data.jsonl import parse_json, read_json, read_text
from plasticlm.errors import PlasticError
from plasticlm.fednl.config import FedNLConfig
from plasticlm.runs import write_text_atomic
from plasticlm.tensor_files import load_tensors

log = logging.getLogger("plasticlm.fednl")
KEEP_ROUNDS = 2


def client_state_root(cfg: FedNLConfig, run_dir: str | Path) -> str:
    """Where clients keep personal state: ``outputs.client_state_dir``, else the run folder's
    ``clients/`` (a node's own ``state-dir`` wins over both, on the node)."""
    return cfg.outputs.client_state_dir or str(Path(run_dir) / "clients")


class Checkpointer:
    """The server's side: global theta and metrics after each finished round."""

    def __init__(self, run_dir: Path, cfg):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.pointer = self.run_dir / "checkpoint.json"
        self.metrics = self.run_dir / "metrics.jsonl"
        self.client_state_dir = client_state_root(cfg, self.run_dir)
        self._torn = False

    def committed_round(self) -> int:
        if not self.pointer.exists():
            return 0
        saved = read_json(self.pointer, "FedNL checkpoint pointer")
        r = saved.get("round") if isinstance(saved, dict) else None
        if not isinstance(r, int) or isinstance(r, bool) or r < 0:
            raise PlasticError(f"{self.pointer} does not name a round ({saved!r:.80}); the run "
                               "folder is damaged, start a fresh run")
        return r

    def latest(self, initial: dict[str, torch.Tensor]) -> tuple[int, dict[str, torch.Tensor]]:
        """(last committed round, its global theta), or (0, ``initial``); drops any metrics
        lines written after that round (a kill between the writes). A damaged theta of the
        last round falls back to the round before it, which is then the committed one."""
        r = self.committed_round()
        while r > 0:
            path = self.run_dir / f"round_{r:04d}" / "theta.safetensors"
            try:
                theta = load_tensors(path, "FedNL checkpoint")
                break
            except PlasticError as e:
                older = self.run_dir / f"round_{r - 1:04d}" / "theta.safetensors"
                if r == 1 or not older.exists():
                    raise PlasticError(f"{e}; no earlier round is kept: the run folder is "
                                       "damaged, start a fresh run") from None
                log.warning("round %d's theta is damaged (%s); resuming from round %d",
                            r, e, r - 1)
                r -= 1
                write_text_atomic(self.pointer, json.dumps({"round": r}) + "\n")
        records = self.records()
        kept = [x for x in records if x["round"] <= r]
        if len(kept) != len(records) or self._torn:
            write_text_atomic(self.metrics, "".join(json.dumps(x, sort_keys=True) + "\n"
                                                    for x in kept))
        return (r, theta) if r > 0 else (0, initial)

    def commit(self, round_: int, theta: dict[str, torch.Tensor], record: dict,
               server_state: dict[str, torch.Tensor] | None = None) -> None:
        """Round ``round_``'s theta, the server optimiser's state (if any) and record."""
        folder = self.run_dir / f"round_{round_:04d}"
        folder.mkdir(exist_ok=True)
        for name, tensors in (("theta", theta), ("server_opt", server_state or {})):
            if tensors:
                tmp = folder / f"{name}.safetensors.partial"
                save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
                os.replace(tmp, folder / f"{name}.safetensors")
        with self.metrics.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        write_text_atomic(self.pointer, json.dumps({"round": round_}) + "\n")
        old = self.run_dir / f"round_{round_ - KEEP_ROUNDS:04d}"
        if old.exists():   # theta per round is in the metrics; two rounds are kept on disk
            shutil.rmtree(old)

    def server_state(self, round_: int) -> dict[str, torch.Tensor]:
        """The server optimiser's state after ``round_`` (empty at round 0 or without one)."""
        path = self.run_dir / f"round_{round_:04d}" / "server_opt.safetensors"
        return load_tensors(path, "FedNL checkpoint") if round_ > 0 and path.exists() else {}

    def records(self) -> list[dict]:
        """The committed rounds' records; a torn last line (a kill mid-append) is dropped,
        a damaged line before it is an error."""
        self._torn = False
        if not self.metrics.exists():
            return []
        lines = [ln for ln in read_text(self.metrics, "FedNL metrics").splitlines() if ln.strip()]
        out = []
        for n, line in enumerate(lines, 1):
            try:
                record = parse_json(line, f"{self.metrics}, line {n}")
            except PlasticError:
                if n == len(lines):
                    log.warning("dropping the torn last line of %s", self.metrics)
                    self._torn = True
                    break
                raise PlasticError(f"{self.metrics}, line {n}: not valid JSON; the run "
                                   "folder is damaged") from None
            r = record.get("round") if isinstance(record, dict) else None
            if not isinstance(r, int) or isinstance(r, bool):
                raise PlasticError(f"{self.metrics}, line {n}: not a round's record; the run "
                                   "folder is damaged")
            out.append(record)
        return out


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
