"""A fuser registry: one folder per ordered pair of models, ``REGISTRY/<T>--to--<R>/``, each a
fuser folder (``fuser_config.json`` + ``fuser.safetensors``) with its ``train_summary.json``;
general fusers are pre-trained into it once and read by every later run. Over the network a
pair is ``/fusers/<T>/<R>``: names there are checked against :data:`SAFE_NAME` and escaped
(:func:`name_in_url`), so a name cannot point a request elsewhere."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

from plasticlm.errors import PlasticError
from plasticlm.refine.fusers.fuser import Fuser

SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")   # no leading dot, <= 128


def check_name(name: object, what: str = "model name") -> str:
    """``name`` when it is a model name that may travel in a URL, else a one-line error."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
        raise PlasticError(f"{what} {str(name)[:80]!r} is not a model name (letters, digits, "
                           "'.', '_', '-'; not starting with '.'; at most 128); rename the "
                           "model folder")
    return name


def name_in_url(name: str, what: str = "model name") -> str:
    """``name`` checked and escaped as one URL path segment."""
    return urllib.parse.quote(check_name(name, what), safe="")


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
