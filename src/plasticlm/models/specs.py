"""Model and data specs: the string a command or a config takes where it wants a model or a
data folder. A local folder or a hub id is itself; ``<head>:<name>`` specs belong to a
*scheme*, registered by the package that owns it (the sandbox registers ``sandbox:receiver``,
``quick:specialist`` and the real-shape ``shape:qwen3-0.6b@2``), so that mechanism code
resolves a spec without importing whoever owns it.

A scheme registers itself in one of two ways, like any plug-in: an entry point in the group
``plasticlm.spec_schemes`` of its package's metadata (plasticlm's own pyproject.toml declares
the sandbox's), loaded on the first resolution; or :func:`register_scheme` when its module is
imported (the sandbox does both, so a source tree without installed metadata works too).

>>> resolve_model("/models/Qwen2.5-0.5B")     # a folder (or a hub id): unchanged
'/models/Qwen2.5-0.5B'
"""

from __future__ import annotations

import logging
from importlib import metadata
from pathlib import Path
from typing import Protocol

log = logging.getLogger("plasticlm.models")
ENTRY_POINTS = "plasticlm.spec_schemes"


class SpecScheme(Protocol):
    """What a scheme answers: whether a spec is its own (cheap: builds nothing), the model
    folder it names (built when missing) and the data folder it names (a one-line
    ``PlasticError`` where it names none)."""

    def claims(self, spec: str) -> bool: ...

    def model(self, spec: str) -> str: ...

    def data(self, spec: str) -> Path: ...


_schemes: dict[str, SpecScheme] = {}
_loaded_entry_points = False


def register_scheme(name: str, scheme: SpecScheme) -> SpecScheme:
    """Add ``scheme`` under ``name`` (a second registration of the same name replaces the
    first: an entry point and an import may both register the same object)."""
    _schemes[name] = scheme
    return scheme


def schemes() -> dict[str, SpecScheme]:
    """Every registered scheme by name, the installed entry points loaded on first use."""
    global _loaded_entry_points
    if not _loaded_entry_points:
        _loaded_entry_points = True
        for ep in metadata.entry_points(group=ENTRY_POINTS):
            if ep.name in _schemes:
                continue
            try:
                register_scheme(ep.name, ep.load())
            except Exception as e:   # a broken plug-in must not stop plain folder specs
                log.warning("spec scheme %r (%s) could not be loaded: %s", ep.name, ep.value, e)
    return _schemes


def owner_of(spec: str) -> SpecScheme | None:
    """The scheme that claims ``spec``, or None (a folder or a hub id)."""
    for scheme in schemes().values():
        if scheme.claims(spec):
            return scheme
    return None


def is_named_spec(spec: str) -> bool:
    """Whether a scheme claims ``spec`` (nothing is built)."""
    return owner_of(str(spec)) is not None


def resolve_model(spec: str) -> str:
    """The model folder ``spec`` names: a scheme's (built when missing), else ``spec`` as
    given (a local folder or a hub id, which the loaders check)."""
    scheme = owner_of(spec)
    return scheme.model(spec) if scheme is not None else spec


def resolve_data(spec: str | Path) -> Path:
    """The data folder ``spec`` names: a scheme's, else ``spec`` as a path."""
    scheme = owner_of(str(spec))
    return Path(spec) if scheme is None else Path(scheme.data(str(spec)))
