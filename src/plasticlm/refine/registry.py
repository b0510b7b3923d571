"""A fuser registry: one folder per ordered pair of models, ``REGISTRY/<T>--to--<R>/``, each a
fuser folder (``fuser_config.json`` + ``fuser.safetensors``) with its ``train_summary.json``;
general fusers are pre-trained into it once and read by every later run."""

from __future__ import annotations

import re
from pathlib import Path

from plasticlm.errors import PlasticError
from plasticlm.refine.fuser import Fuser


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"


def pair_folder(registry: str | Path, transmitter: str, receiver: str) -> Path:
    """Where the fuser ``transmitter -> receiver`` lives in ``registry``."""
    return Path(registry) / f"{_slug(transmitter)}--to--{_slug(receiver)}"


def registered_pairs(registry: str | Path) -> list[tuple[str, str]]:
    """The ``(transmitter, receiver)`` pairs that have a fuser in ``registry``."""
    root = Path(registry)
    pairs = []
    for folder in sorted(root.glob("*--to--*")):
        if (folder / "fuser_config.json").is_file():
            t, _, r = folder.name.partition("--to--")
            pairs.append((t, r))
    return pairs


def load_registered(registry: str | Path, transmitter: str, receiver: str) -> Fuser:
    """The registered fuser ``transmitter -> receiver``; an error lists what is there."""
    folder = pair_folder(registry, transmitter, receiver)
    if not folder.is_dir():
        have = ", ".join(f"{t} -> {r}" for t, r in registered_pairs(registry)) or "none"
        raise PlasticError(f"no fuser {transmitter} -> {receiver} in {registry} (registered: "
                           f"{have}); train one with `plasticlm refine pretrain-fuser`")
    return Fuser.from_pretrained(folder)
