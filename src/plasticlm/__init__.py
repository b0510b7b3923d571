"""plasticlm: LLMs that keep learning after pre-training.

Three methods on one shared ground:
- ``plasticlm.fednl``  federated nested learning with a delta-rule memory,
- ``plasticlm.refine`` federated inference by KV-cache exchange,
- ``plasticlm.scol``   self-consolidating language models.
Shared ground: ``plasticlm.models`` (loading, tiny builders, llama2.c import),
``plasticlm.runs`` (seeds, run folders, devices), ``plasticlm.config``.
"""

import os as _os
from pathlib import Path as _Path


def _pin_float_path() -> None:
    """One float path on every x86-64 CPU with AVX2: torch's kernels and MKL otherwise take
    the widest SIMD the CPU has (AVX-512 where there is one), another width sums float32 in
    another order, and the same seed trains another sandbox family (docs/sandbox.md). Works
    only when plasticlm is imported before torch computes anything; a value already in the
    environment wins."""
    try:
        flags = next(line for line in _Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return
    if "avx2" in flags and "fma" in flags:
        _os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
        _os.environ.setdefault("MKL_CBWR", "AVX2")


_pin_float_path()

from plasticlm.errors import PlasticError  # noqa: E402

__version__ = "0.1.0"
__all__ = ["PlasticError", "__version__"]
