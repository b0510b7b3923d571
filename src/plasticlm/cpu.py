"""What the CPU is, read without torch: :func:`configure` pins the float path from it before
torch loads (the CLI calls it; importing plasticlm changes no process-wide setting), and
:func:`plasticlm.runtime.machine` reports it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

# The SIMD path torch's kernels and MKL are pinned to where the CPU has it, the path the
# published sandbox family was trained on (docs/sandbox.md).
FLOAT_PATH = "AVX2"


def cpuinfo_field(name: str) -> str:
    """The first ``name : value`` line of /proc/cpuinfo (Linux), or "" where there is none."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name) and ":" in line:
                return line.split(":", 1)[1].strip()
    return ""


def has_float_path() -> bool:
    """Whether this CPU can run torch's AVX2 kernels (AVX2 and FMA)."""
    flags = cpuinfo_field("flags").split()
    return "avx2" in flags and "fma" in flags


def configure() -> bool:
    """Pin torch's kernels and MKL to one float path (AVX2) for this process and the processes
    it starts, where the CPU has it; returns whether it did.

    torch's kernels and MKL otherwise take the widest SIMD the CPU has (AVX-512 where there is
    one); another width sums float32 in another order, and the same seed trains another
    sandbox family (docs/sandbox.md). It acts only when called before torch computes anything
    (the ``plasticlm`` command calls it first thing); a value already in the environment wins.
    """
    if not has_float_path():
        return False
    os.environ.setdefault("ATEN_CPU_CAPABILITY", FLOAT_PATH.lower())
    os.environ.setdefault("MKL_CBWR", FLOAT_PATH)
    return True
