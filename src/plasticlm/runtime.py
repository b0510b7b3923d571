"""torch's side of a run: seeding, the device and dtype models load on (``runtime``), the
one torch thread policy (``set_threads``) and the machine a run ran on. The environment
variables and choice names they read are in ``plasticlm.env``."""

from __future__ import annotations

import contextlib
import os
import platform
import random
from collections.abc import Iterator

import numpy as np
import torch

from plasticlm.cpu import cpuinfo_field
from plasticlm.env import (
    DEVICE_ENV,
    DEVICES,
    DTYPE_ALIASES,
    DTYPE_ENV,
    DTYPE_NAMES,
    THREADS_ENV,
    environment,
)
from plasticlm.errors import PlasticError

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


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
    name = DTYPE_ALIASES.get(name, name)
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
