"""Reading a safetensors file, with one clear error for a missing or damaged one."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from plasticlm.errors import PlasticError


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
