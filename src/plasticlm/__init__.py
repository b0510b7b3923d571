"""plasticlm: LLMs that keep learning after pre-training.

Three methods on one shared ground:
- ``plasticlm.fednl``  federated nested learning with a delta-rule memory,
- ``plasticlm.refine`` federated inference by KV-cache exchange,
- ``plasticlm.scol``   self-consolidating language models.
Shared ground: ``plasticlm.models`` (loading, tiny builders, llama2.c import),
``plasticlm.runs`` (run folders), ``plasticlm.runtime`` (seeds, devices, threads),
``plasticlm.config``.
"""

import os as _os

from plasticlm.cpu import FLOAT_PATH as _FLOAT_PATH
from plasticlm.cpu import has_float_path as _has_float_path

# One float path on every x86-64 CPU with AVX2: torch's kernels and MKL otherwise take the
# widest SIMD the CPU has (AVX-512 where there is one), another width sums float32 in another
# order, and the same seed trains another sandbox family (docs/sandbox.md). Works only when
# plasticlm is imported before torch computes anything; a value already in the environment
# wins.
if _has_float_path():
    _os.environ.setdefault("ATEN_CPU_CAPABILITY", _FLOAT_PATH.lower())
    _os.environ.setdefault("MKL_CBWR", _FLOAT_PATH)

from plasticlm.errors import PlasticError  # noqa: E402

__version__ = "0.1.0"
__all__ = ["PlasticError", "__version__"]
