"""Configuration: typed, frozen, nested sections validated once, where they are loaded.

A config is a :func:`configclass` (a frozen pydantic dataclass that refuses unknown keys);
each field carries its type (``Literal`` for string choices, a registry key for extension
points), its range and its help (``Field(default, description=..., ge=...)``). One grammar
builds it everywhere: defaults, then a packaged preset file, then the user's TOML/YAML/JSON
file, then ``--set key=value`` overrides, dotted for nested sections.

>>> cfg = load_config(MyConfig, "run.toml", ["train.lr=1e-3", "rounds=5"])  # doctest: +SKIP

Values given on the command line are parsed as TOML literals when they can be (numbers,
booleans, lists), else kept as strings. The resolved config of a run is written to its
folder (:func:`save_config`) and a run resumes from it (:func:`read_saved_config`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import tomllib
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as _pydantic_dataclass

from plasticlm.config_files import loads_json, read_config_file
from plasticlm.errors import PlasticError
from plasticlm.registry import Registry

__all__ = ["Field", "configclass", "load_config", "from_dict", "to_dict", "save_config",
           "read_saved_config", "field_docs", "describe", "preset_path", "override",
           "read_config_file", "parse_value", "deep_update", "overrides_tree"]

T = TypeVar("T")
log = logging.getLogger("plasticlm")

# lax numbers (1 for 1.0, lists for tuples) but never a silent extra key, NaN or infinity
_SECTION = ConfigDict(extra="forbid", allow_inf_nan=False)


def configclass(cls: type[T]) -> type[T]:
    """A config section: a frozen dataclass validated by pydantic on every construction
    (``from_dict``, ``dataclasses.replace`` and direct calls alike); unknown keys refused."""
    return _pydantic_dataclass(cls, frozen=True, config=_SECTION)


def is_config(cls: Any) -> bool:
    return isinstance(cls, type) and hasattr(cls, "__pydantic_fields__") and \
        dataclasses.is_dataclass(cls)


def _section(cls: type, path: tuple) -> type | None:
    """The config class at dotted ``path`` inside ``cls`` (None when it is not a section)."""
    for key in path:
        info = getattr(cls, "__pydantic_fields__", {}).get(key)
        if info is None or not is_config(info.annotation):
            return None
        cls = info.annotation
    return cls


def _problem(err: dict, cls: type) -> str:
    where = ".".join(str(x) for x in err["loc"]) or "root"
    if err["type"] == "unexpected_keyword_argument":
        section = _section(cls, tuple(err["loc"][:-1]))
        known = sorted(getattr(section, "__pydantic_fields__", {}))
        return f"config {where}: unknown key" + (f" (known: {', '.join(known)})" if known else "")
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    got = "" if isinstance(got, dict) or got is None else f", got {got!r}"
    return f"config {where}: {msg[0].lower()}{msg[1:]}{got}"


def refusal(e: ValidationError, cls: type) -> PlasticError:
    """A pydantic ``ValidationError`` of config ``cls`` as one line naming each key."""
    return PlasticError("; ".join(_problem(err, cls) for err in e.errors()))


def from_dict(cls: type[T], data: Any) -> T:
    """Build config ``cls`` from a nested dict; every problem is refused in one line that
    names the key, what was expected (the choices of a ``Literal``) and what was given.

    A key the class has renamed (its ``RENAMED_KEYS``, dotted old -> dotted new) is read
    under its new name with a warning, so that saved run folders and old files still load."""
    if not isinstance(data, dict):
        raise PlasticError(f"config: expected a table of keys, got {data!r}")
    data = _renamed(cls, data)
    _refuse_bool_numbers(cls, data, "")
    try:
        return TypeAdapter(cls).validate_python(data)
    except ValidationError as e:
        raise refusal(e, cls) from None


def _renamed(cls: type, data: dict) -> dict:
    """``data`` with the renamed keys of ``cls`` and of every section inside it moved."""
    fields = getattr(cls, "__pydantic_fields__", {})
    renames = getattr(cls, "RENAMED_KEYS", None) or {}
    nested = {k: info.annotation for k, info in fields.items()
              if is_config(info.annotation) and isinstance(data.get(k), dict)}
    if not renames and not nested:
        return data
    data = copy.deepcopy(data)
    for key, section in nested.items():
        data[key] = _renamed(section, data[key])
    for old, new in renames.items():
        *parents, last = old.split(".")
        node = data
        for k in parents:
            node = node.get(k) if isinstance(node, dict) else None
        if not isinstance(node, dict) or last not in node:
            continue
        value = node.pop(last)
        if _get_path(data, new) is None:
            _set_path(data, new, value)
            log.warning("config %s is now %s: read as that", old, new)
        else:
            raise PlasticError(f"config {old} is now {new}, and both are given: keep {new}")
    return data


def _get_path(tree: dict, dotted: str) -> Any:
    for k in dotted.split("."):
        if not isinstance(tree, dict) or k not in tree:
            return None
        tree = tree[k]
    return tree


def _refuse_bool_numbers(cls: type, data: dict, where: str) -> None:
    """pydantic's lax mode reads ``true`` as 1 for a number: refuse it, as a typo."""
    fields = getattr(cls, "__pydantic_fields__", {})
    for key, value in data.items():
        info = fields.get(key)
        if info is None:
            continue
        if is_config(info.annotation) and isinstance(value, dict):
            _refuse_bool_numbers(info.annotation, value, f"{where}{key}.")
        elif isinstance(value, bool) and info.annotation in (int, float):
            raise PlasticError(f"config {where}{key}: expected a number, got {value!r}")
        elif isinstance(value, int) and info.annotation is int and not isinstance(value, bool):
            # torch and NumPy take seeds in [0, 2**32) and sizes in int64: refused here, not
            # an overflow deep inside
            if (key == "seed" or key.endswith("_seed")) and not 0 <= value < 2**32:
                raise PlasticError(f"config {where}{key}: a seed is in [0, 2**32), not {value}")
            if abs(value) >= 2**63:
                raise PlasticError(f"config {where}{key}: {value} does not fit in 64 bits")


def to_dict(cfg: Any) -> dict:
    """The config as plain JSON values (tuples as lists), nested sections as tables."""
    return TypeAdapter(type(cfg)).dump_python(cfg, mode="json")


def override(cfg: T, changes: dict[str, Any]) -> T:
    """A copy of ``cfg`` with dotted-key ``changes`` (``{"method.name": "fedavg"}``) applied
    and the whole config validated again."""
    tree = to_dict(cfg)
    for key, value in changes.items():
        _set_path(tree, key, value)
    return from_dict(type(cfg), tree)


def parse_value(text: str) -> Any:
    """``"3"`` -> 3, ``"true"`` -> True, ``"[1,2]"`` -> [1, 2], anything else stays a string
    (so does a text that is more than one TOML value, such as ``"1\nrounds = 2"``)."""
    try:
        parsed = tomllib.loads(f"v = {text}")
    except (ValueError, RecursionError):   # TOMLDecodeError, an integer too long to convert
        return text
    return parsed["v"] if list(parsed) == ["v"] else text


def _set_path(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for n, k in enumerate(keys[:-1], 1):
        tree = tree.setdefault(k, {})
        if not isinstance(tree, dict):
            raise PlasticError(f"override {dotted}: {'.'.join(keys[:n])} is not a table of keys")
    tree[keys[-1]] = value


def overrides_tree(items: list[str] | tuple[str, ...]) -> dict:
    """``["train.lr=1e-3", "rounds=5"]`` -> ``{"train": {"lr": 0.001}, "rounds": 5}``."""
    tree: dict = {}
    for item in items:
        if "=" not in item:
            raise PlasticError(f"override {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        _set_path(tree, key.strip(), parse_value(value.strip()))
    return tree


PRESETS_DIR = Path(__file__).parent / "configs"


def preset_path(method: str, name: str) -> Path:
    """The packaged preset ``configs/<method>/<name>.toml``."""
    path = PRESETS_DIR / method / f"{name}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in (PRESETS_DIR / method).glob("*.toml"))
        raise PlasticError(f"no preset {name!r} for {method}; known: {', '.join(known) or 'none'}")
    return path


def deep_update(into: dict, new: dict) -> dict:
    """``into`` updated in place by ``new``, nested tables key by key; returns ``into``."""
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            deep_update(into[k], v)
        else:
            into[k] = v
    return into


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] = (),
                preset: str | Path | None = None) -> T:
    """Defaults of ``cls``, updated by the ``preset`` file, then the file at ``path``, then
    ``key=value`` overrides; validated once, here."""
    # A section whose default is built by a factory (e.g. another objective than its class's
    # own default) keeps that default under partial changes of the section.
    data: dict = {name: to_dict(info.default_factory())
                  for name, info in getattr(cls, "__pydantic_fields__", {}).items()
                  if is_config(info.annotation) and info.default_factory is not None}
    for file in (preset, path):
        if file:
            deep_update(data, read_config_file(file))
    deep_update(data, overrides_tree(list(overrides)))
    return from_dict(cls, data)


def save_config(cfg: Any, folder: str | Path, name: str = "config.json") -> Path:
    """Write the resolved ``cfg`` (every field, defaults included) as JSON into ``folder``."""
    path = Path(folder) / name
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(to_dict(cfg), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def read_saved_config(cls: type[T], folder: str | Path, name: str = "config.json") -> T:
    """The config a run saved with :func:`save_config`, validated as ``cls``."""
    path = Path(folder) / name
    if not path.is_file():
        raise PlasticError(f"{folder} holds no {name}: not a run folder of this tool")
    try:
        data = loads_json(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise PlasticError(f"{path} is not valid JSON: {e}") from None
    return from_dict(cls, data)


def _choices(info: Any) -> str:
    """The valid values of a field: a ``Literal``'s, or a registry key's members."""
    if typing.get_origin(info.annotation) is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(info.annotation))
    for m in info.metadata:
        registry = getattr(getattr(m, "func", None), "__self__", None)
        if isinstance(registry, Registry):
            return " | ".join(registry.names())
    return ""


def field_docs(cls: type, prefix: str = "") -> list[tuple[str, Any, str]]:
    """``(dotted key, default, help)`` of every field of config ``cls``, nested sections
    flattened; the help is the field's ``description`` (its choices first when a Literal)."""
    if not is_config(cls):
        raise TypeError(f"{cls!r} is not a configclass")
    out = []
    for name, info in cls.__pydantic_fields__.items():
        default = info.default_factory() if info.default_factory is not None else \
            None if info.is_required() else info.default
        if is_config(info.annotation):
            out += field_docs(info.annotation, f"{prefix}{name}.")
            continue
        choices = _choices(info)
        text = info.description or ""
        out.append((prefix + name, default,
                    f"{choices}: {text}" if choices and text else choices or text))
    return out


def describe(cls: type) -> str:
    """The ``--set`` keys of ``cls`` with defaults and help, one per line (for ``--help``)."""
    rows = field_docs(cls)
    width = max((len(k) for k, _, _ in rows), default=0)

    def shown(d):
        if isinstance(d, str):
            return repr(d)
        return json.dumps(list(d) if isinstance(d, tuple) else d)
    return "\n".join(f"  {k:<{width}}  {shown(d)}" + (f"  {h}" if h else "") for k, d, h in rows)

