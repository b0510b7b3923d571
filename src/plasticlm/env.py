"""The environment variables that carry a command's runtime choices (threads, device, dtype)
to the processes it starts, and the names ``--device``/``--dtype`` accept: no torch here, so
the command line's parser can offer them without loading it (torch's side: ``runtime``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

THREADS_ENV = "PLASTICLM_THREADS"
# Where and in which dtype models load (plasticlm.models.load_causal_lm); the command line's
# --device/--dtype set them for the command and the processes it starts (runtime.runtime).
DEVICE_ENV, DTYPE_ENV = "PLASTICLM_DEVICE", "PLASTICLM_DTYPE"
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPE_NAMES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


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
