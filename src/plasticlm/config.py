"""Configuration as dataclasses: loaded from TOML/YAML/JSON, overridden by ``key=value``.

>>> cfg = load_config(MyConfig, "run.toml", ["train.lr=1e-3", "rounds=5"])  # doctest: +SKIP

Nested dataclasses are addressed with dots. Values given on the command line are parsed
as TOML literals when they can be (numbers, booleans, lists), else kept as strings.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import typing
from pathlib import Path
from typing import Any, TypeVar

from plasticlm.errors import PlasticError

T = TypeVar("T")


def read_config_file(path: str | Path) -> dict:
    """Read a TOML, YAML or JSON file into a dict."""
    path = Path(path)
    if not path.exists():
        raise PlasticError(f"config file {path} does not exist")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            return tomllib.loads(text)
        if path.suffix in (".yaml", ".yml"):
            import yaml

            return yaml.safe_load(text) or {}
        if path.suffix == ".json":
            return json.loads(text)
    except Exception as e:  # parser errors carry the line; keep them
        raise PlasticError(f"could not parse config {path}: {e}") from None
    raise PlasticError(f"config {path}: unknown format {path.suffix!r} (use .toml, .yaml or .json)")


def parse_value(text: str) -> Any:
    """``"3"`` -> 3, ``"true"`` -> True, ``"[1,2]"`` -> [1, 2], anything else stays a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set_path(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        tree = tree.setdefault(k, {})
    tree[keys[-1]] = value


def from_dict(cls: type[T], data: dict, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys are an error that names them."""
    if not isinstance(data, dict):
        raise PlasticError(f"config {where or 'root'}: expected a table, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise PlasticError(
            f"unknown config key(s) {', '.join(where + k for k in unknown)}; "
            f"known: {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        hint = hints.get(name)
        if dataclasses.is_dataclass(hint):
            kwargs[name] = from_dict(hint, value, where=f"{where}{name}.")
        elif hint is float and isinstance(value, int):
            kwargs[name] = float(value)
        elif (hint is tuple or typing.get_origin(hint) is tuple) and isinstance(value, list):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] = ()) -> T:
    """Defaults of ``cls``, updated by the file at ``path``, then by ``key=value`` overrides."""
    data = read_config_file(path) if path else {}
    for item in overrides:
        if "=" not in item:
            raise PlasticError(f"override {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        _set_path(data, key.strip(), parse_value(value.strip()))
    return from_dict(cls, data)


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)
