"""What travels between a FedNL server and its clients: theta, packed as a Flower
``ArrayRecord`` in the run's transfer dtype and unpacked to float32. The memory state of
``fednl`` is built inside each forward pass on the device and is never part of a message."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord

DTYPES = {"float32": torch.float32, "float16": torch.float16}


def pack_theta(theta: dict[str, torch.Tensor], dtype: str) -> ArrayRecord:
    """``theta`` (name -> tensor) as an ``ArrayRecord`` in ``dtype`` ("float32"/"float16")."""
    return ArrayRecord({k: v.to(DTYPES[dtype]).contiguous() for k, v in theta.items()})


def unpack_theta(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """The record's tensors as float32 (name -> tensor)."""
    return {k: v.float() for k, v in record.to_torch_state_dict().items()}


def arrays_problem(record: ArrayRecord, reference: dict[str, torch.Tensor]) -> str | None:
    """Why a received record cannot be theta (its names, dtypes or shapes, read from the
    arrays' headers before any is deserialised), or None."""
    missing, extra = sorted(set(reference) - set(record)), sorted(set(record) - set(reference))
    if missing or extra:
        return f"wrong keys (missing {missing[:3]}, unexpected {extra[:3]})"
    for name, ref in reference.items():
        array = record[name]
        if array.dtype not in DTYPES:
            return f"{name} has dtype {str(array.dtype)[:20]}, expected one of {sorted(DTYPES)}"
        if tuple(array.shape) != tuple(ref.shape):
            return f"{name} has shape {tuple(array.shape)[:8]}, expected {tuple(ref.shape)}"
    return None
