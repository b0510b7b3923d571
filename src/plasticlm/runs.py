"""Seeding, run folders, atomic writes, device selection, the cache home, the torch thread
policy and the machine a run ran on."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from plasticlm.cpu import cpuinfo_field
from plasticlm.errors import PlasticError

THREADS_ENV = "PLASTICLM_THREADS"
# Where and in which dtype models load (plasticlm.models.load_causal_lm); the command line's
# --device/--dtype set them for the command and the processes it starts (see runtime()).
DEVICE_ENV, DTYPE_ENV = "PLASTICLM_DEVICE", "PLASTICLM_DTYPE"
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) so a run repeats exactly on CPU."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The device models run on: ``device`` when given, else ``$PLASTICLM_DEVICE``, else
    "auto" (CUDA when present, else the CPU; Apple's MPS only when asked for, as not every
    op runs there). A device this machine lacks is a :class:`PlasticError` saying what to
    use instead."""
    if isinstance(device, torch.device):
        device = str(device)
    name = (device or os.environ.get(DEVICE_ENV, "") or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kind, _, index = name.partition(":")
    if kind not in DEVICES[1:] or (index and (kind != "cuda" or not index.isdigit())):
        raise PlasticError(f"unknown device {name!r}; use one of auto, cpu, cuda, cuda:N, mps")
    if kind == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "no GPU visible"
        raise PlasticError(f"device {name!r}: CUDA is not available here (torch "
                           f"{torch.__version__}, {build}); use --device cpu (or auto), or "
                           f"unset ${DEVICE_ENV}")
    if kind == "cuda" and index and int(index) >= torch.cuda.device_count():
        raise PlasticError(f"device {name!r}: this machine has {torch.cuda.device_count()} "
                           f"CUDA device(s), numbered from 0")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise PlasticError(f"device {name!r}: Apple's MPS is not available here; use --device "
                           "cpu (or auto)")
    return torch.device(name)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> "bfloat16", as ``--dtype`` spells it."""
    return str(dtype).removeprefix("torch.")


def pick_dtype(dtype: str | torch.dtype | None = None) -> torch.dtype:
    """The dtype models load in: ``dtype`` when given, else ``$PLASTICLM_DTYPE``, else
    float32."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = (dtype or os.environ.get(DTYPE_ENV, "") or "float32").strip().lower()
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise PlasticError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[name]


@contextlib.contextmanager
def runtime(device: str | None = None, dtype: str | None = None
            ) -> Iterator[tuple[torch.device, torch.dtype]]:
    """``with runtime("cuda", "bfloat16"): ...`` loads every model of the block there and in
    that dtype, here and in the processes the block starts (Flower's simulated clients,
    local SuperNodes): the choice is checked up front, then travels as ``$PLASTICLM_DEVICE``
    (resolved, never "auto", so that every process agrees) and ``$PLASTICLM_DTYPE``; both are
    restored afterwards."""
    chosen = pick_device(device), pick_dtype(dtype)
    if chosen[0].type == "cuda" and chosen[1] == torch.bfloat16 \
            and not torch.cuda.is_bf16_supported():
        raise PlasticError("this GPU has no bfloat16; use --dtype float16 or float32")
    with environment(**{DEVICE_ENV: str(chosen[0]), DTYPE_ENV: dtype_name(chosen[1])}):
        yield chosen


@contextlib.contextmanager
def environment(**variables: str) -> Iterator[None]:
    """These environment variables set for the block (and the processes it starts), then
    restored as they were."""
    previous = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def set_threads(threads: int | None = None) -> int:
    """Set torch's intra-op thread count by the one thread policy; returns the count.

    Resolution order: ``threads`` when given, else ``$PLASTICLM_THREADS``, else
    ``os.cpu_count()``. Several processes sharing a few cores (Flower simulation clients,
    SuperNodes started on one machine, helper processes next to a training job) should each
    use 1, so that together they do not ask for more threads than there are cores. The FedNL
    simulation does so: ``fednl.run`` gives each client one Ray CPU and exports
    ``PLASTICLM_THREADS=1`` to the client processes (as ``fednl.deploy`` does to the
    SuperNodes it starts), and the ClientApp calls ``set_threads()``. The ``plasticlm``
    command line calls it once, from its global ``--threads`` option or the environment.
    """
    if threads is None:
        env = os.environ.get(THREADS_ENV, "").strip()
        if env:
            try:
                threads = int(env)
            except ValueError:
                raise PlasticError(f"${THREADS_ENV} must be a whole number of threads, "
                                   f"not {env!r}") from None
        else:
            threads = os.cpu_count() or 1
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise PlasticError(f"the torch thread count must be a whole number >= 1, not {threads!r}")
    torch.set_num_threads(threads)
    return threads


@contextlib.contextmanager
def threads(n: int | None = None) -> Iterator[int]:
    """``with threads(1): ...`` runs the block with :func:`set_threads` ``(n)`` threads and
    restores the previous count afterwards, also when the block raises."""
    previous = torch.get_num_threads()
    try:
        yield set_threads(n)
    finally:
        torch.set_num_threads(previous)


def machine() -> dict:
    """The CPU a run's floats came from: its model name, the SIMD level torch dispatches to,
    MKL's code path and the core count. Float32 training of the same seed repeats exactly on
    one kind of CPU but can land elsewhere on another (docs/sandbox.md), so reports record
    it (``plasticlm`` pins both paths to AVX2 where the CPU has it)."""
    return {"cpu": cpuinfo_field("model name") or platform.processor() or platform.machine(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            # what the environment asked MKL for (torch does not say which path MKL took)
            "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
            "cpu_count": os.cpu_count(), "torch": torch.__version__}


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


def load_tensors(path: str | Path, what: str = "tensor file") -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a missing, truncated or garbage file is one clear
    error naming ``what`` (never pickle: nothing received is executed)."""
    path = Path(path)
    if not path.is_file():
        raise PlasticError(f"{what} {path} does not exist")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise PlasticError(f"{what} {path} is not a readable safetensors file ({e}); it may be "
                           "truncated or from another program: write it again") from None


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` beside ``path`` and rename it into place: a crash leaves the old file or
    the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


@contextlib.contextmanager
def atomic_folder(folder: str | Path) -> Iterator[Path]:
    """A fresh folder beside ``folder`` to write into; when the block ends without error it
    replaces ``folder`` (so a crash never leaves half a model or checkpoint there).

    >>> with atomic_folder(out) as tmp:          # doctest: +SKIP
    ...     model.save_pretrained(tmp)
    """
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def clear_run_folder(folder: str | Path, hint: str) -> None:
    """Remove ``folder`` for a new run, but only an earlier run's (it holds ``config.json``)
    or an empty one: a mistyped output path must never delete a user's folder. Otherwise
    raises :class:`PlasticError` ending with ``hint`` (what to pass instead)."""
    folder = Path(folder)
    if not folder.exists():
        return
    if folder.is_dir() and ((folder / "config.json").is_file() or not any(folder.iterdir())):
        shutil.rmtree(folder)
        return
    raise PlasticError(f"{folder} exists and is not a run folder; nothing was removed: {hint}")


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
        return write_text_atomic(self.path / filename, json.dumps(_jsonable(obj), indent=2) + "\n")

    def log(self, **metrics: Any) -> dict:
        """Append one record (with a wall-clock ``time``) to ``metrics.jsonl``."""
        record = {"time": round(time.time(), 3), **_jsonable(metrics)}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
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
