"""Config files read strictly, once, where they are loaded: TOML, YAML and JSON into plain
tables, each refused in one line when it holds a key twice (JSON and YAML would silently keep
the last), a non-finite number (JSON's ``NaN``, YAML's ``.nan``, TOML's ``inf``), a YAML
anchor or alias (refused before anything is expanded: a "billion laughs" file is a few
lines), or nesting too deep to read.

>>> read_config_file("run.yaml")            # doctest: +SKIP
{'train': {'lr': 0.001}}
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any

import yaml

from plasticlm.errors import PlasticError, clip

FORMATS = (".toml", ".yaml", ".yml", ".json")


class _Refused(ValueError):
    """A strictness rule broken while parsing (its message names the key or line)."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise _Refused(f"key {clip(repr(key))} is given twice")
        seen[key] = value
    return seen


def _no_constant(name: str) -> float:
    raise _Refused(f"{name} is not a number a config may hold (JSON has no NaN or infinity)")


def loads_json(text: str) -> Any:
    """JSON without duplicate keys or NaN/Infinity (raises ``ValueError``)."""
    return json.loads(text, object_pairs_hook=_unique_pairs, parse_constant=_no_constant)


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors, aliases or repeated keys."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            mark = event.start_mark
            raise _Refused(f"YAML anchors and aliases are not accepted (line {mark.line + 1}): "
                           "write each value out")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        keys = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (dict, list)) or key in keys:
                raise _Refused(f"key {clip(repr(key))} is given twice or is not a name (line "
                               f"{key_node.start_mark.line + 1})")
            keys.add(key)
        return super().construct_mapping(node, deep=deep)


def loads_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_StrictLoader)   # noqa: S506 (a SafeLoader, stricter)


def _check_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise _Refused(f"{where or 'the file'}: {value} is not a finite number")
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        _check_finite(item, f"{where}.{key}" if where else str(key))


def read_config_file(path: str | Path) -> dict:
    """Read a TOML, YAML or JSON file into a dict, strictly (see the module)."""
    path = Path(path)
    if not path.exists():
        raise PlasticError(f"config file {clip(path)} does not exist")
    if path.suffix not in FORMATS:
        raise PlasticError(f"config {clip(path)}: unknown format {path.suffix!r} (use .toml, "
                           ".yaml or .json)")
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = loads_json(text)
        else:
            data = loads_yaml(text) or {}
        _check_finite(data, "")
    except RecursionError:
        raise PlasticError(f"could not parse config {clip(path)}: nested too deeply") from None
    except Exception as e:  # parser errors carry the line; keep them
        raise PlasticError(f"could not parse config {clip(path)}: {clip(e, 500)}") from None
    if not isinstance(data, dict):
        raise PlasticError(f"config {clip(path)}: expected a table of keys, got "
                           f"{type(data).__name__}")
    return data
