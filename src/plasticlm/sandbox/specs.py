"""``<preset>:<name>`` specs: where commands accept a sandbox model or world by name."""

from __future__ import annotations

from pathlib import Path

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


def resolve_model_spec(spec: str) -> str:
    """``<preset>:<name>`` (``sandbox:receiver``, ``quick:specialist``,
    ``sandbox-quick:receiver``) -> the pre-trained sandbox folder, trained when missing;
    ``shape:<name>[@<layers>]`` (``shape:qwen2.5-0.5b@2``) -> a real-shape model folder
    (:mod:`plasticlm.sandbox.shapes`), built when missing; any other spec (a local folder or
    a hub id) unchanged."""
    shape = shape_spec_of(spec)
    if shape is not None:
        return str(shape_model(*shape))
    head, _, name = spec.partition(":")
    preset = sandbox_preset_of(head) if name else None
    return str(sandbox_model(name, preset=preset)) if preset else spec


def resolve_data_spec(spec: str) -> Path:
    """A preset name (``sandbox``, ``quick``, ``sandbox-quick``) -> its world folder; any
    other spec -> that folder."""
    preset = sandbox_preset_of(spec)
    return Path(sandbox_world(preset)) if preset else Path(spec)
