"""The sandbox's spec schemes, registered with :mod:`plasticlm.models.specs` (by the entry
points in pyproject.toml and when this module is imported): ``<preset>:<name>`` names a model
of a preset's family (``sandbox:receiver``, ``quick:specialist``, ``sandbox-quick:receiver``),
a preset's name alone its world (``sandbox``, ``sandbox-quick``), and ``shape:<name>[@<layers>]``
a real-shape model (:mod:`plasticlm.sandbox.shapes`)."""

from __future__ import annotations

from pathlib import Path

from plasticlm.errors import PlasticError
from plasticlm.models.specs import register_scheme, resolve_data, resolve_model
from plasticlm.sandbox.presets import PRESETS
from plasticlm.sandbox.pretrain import sandbox_model, sandbox_world
from plasticlm.sandbox.shapes import shape_model, shape_spec_of


def sandbox_preset_of(spec: str) -> str | None:
    """The preset a spec names: ``"sandbox"`` and ``"quick"`` as themselves,
    ``"sandbox-quick"`` as ``"quick"``; None for anything else (a path, a hub id)."""
    if spec in PRESETS:
        return spec
    if spec.startswith("sandbox-") and spec[len("sandbox-"):] in PRESETS:
        return spec[len("sandbox-"):]
    return None


class SandboxScheme:
    """``<preset>:<name>`` -> the pre-trained model folder (trained when missing);
    ``<preset>`` -> the preset's world folder."""

    def claims(self, spec: str) -> bool:
        head, colon, name = spec.partition(":")
        return sandbox_preset_of(head) is not None and (bool(name) or not colon)

    def model(self, spec: str) -> str:
        head, _, name = spec.partition(":")
        if not name:
            raise PlasticError(f"{spec!r} names a sandbox world; a sandbox model is "
                               f"<preset>:<name>, e.g. {head}:receiver")
        return str(sandbox_model(name, preset=sandbox_preset_of(head)))

    def data(self, spec: str) -> Path:
        return Path(sandbox_world(sandbox_preset_of(spec.partition(":")[0])))


class ShapeScheme:
    """``shape:<name>[@<layers>]`` -> a real-shape model folder, built when missing."""

    def claims(self, spec: str) -> bool:
        return spec.startswith("shape:")

    def model(self, spec: str) -> str:
        return str(shape_model(*shape_spec_of(spec)))

    def data(self, spec: str) -> Path:
        raise PlasticError(f"{spec} names a model, not a data folder")


SANDBOX = register_scheme("sandbox", SandboxScheme())
SHAPE = register_scheme("shape", ShapeScheme())


def resolve_model_spec(spec: str) -> str:
    """:func:`plasticlm.models.specs.resolve_model` (kept for the sandbox's callers)."""
    return resolve_model(spec)


def resolve_data_spec(spec: str) -> Path:
    """:func:`plasticlm.models.specs.resolve_data` (kept for the sandbox's callers)."""
    return resolve_data(spec)
