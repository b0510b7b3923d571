"""What the CPU is, read without torch: ``plasticlm/__init__`` pins the float path from it
before torch loads, and :func:`plasticlm.runtime.machine` reports it."""

from __future__ import annotations

import contextlib
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
