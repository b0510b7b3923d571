"""Configuration as dataclasses: defaults, then a preset file, then the user's TOML/YAML/JSON
file, then ``key=value`` overrides (the one grammar of every command: ``--config FILE --set
key=value``).

>>> cfg = load_config(MyConfig, "run.toml", ["train.lr=1e-3", "rounds=5"])  # doctest: +SKIP

Nested dataclasses are addressed with dots. Values given on the command line are parsed
as TOML literals when they can be (numbers, booleans, lists), else kept as strings. Presets
are files in ``plasticlm/configs/<method>/<name>.toml`` (:func:`preset_path`); the help of a
field is the comment beside it in its dataclass (:func:`field_docs`).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import tokenize
import tomllib
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from plasticlm.errors import PlasticError

T = TypeVar("T")


def read_config_file(path: str | Path) -> dict:
    """Read a TOML, YAML or JSON file into a dict."""
    path = Path(path)
    if not path.exists():
        raise PlasticError(f"config file {path} does not exist")
    if path.suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise PlasticError(f"config {path}: unknown format {path.suffix!r} (use .toml, .yaml "
                           "or .json)")
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text) or {}
    except Exception as e:  # parser errors carry the line; keep them
        raise PlasticError(f"could not parse config {path}: {e}") from None
    if not isinstance(data, dict):
        raise PlasticError(f"config {path}: expected a table of keys, got {type(data).__name__}")
    return data


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


def from_dict(cls: type[T], data: dict, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys are an error that names them."""
    if not isinstance(data, dict):
        raise PlasticError(f"config {where or 'root'}: expected a table, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in set(data) - set(fields))   # YAML keys may be numbers
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
        elif hint is float and isinstance(value, int) and not isinstance(value, bool):
            kwargs[name] = float(value)
        elif (hint is tuple or typing.get_origin(hint) is tuple) and isinstance(value, list):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
        problem = _type_problem(hint, kwargs[name])
        if problem:
            raise PlasticError(f"config {where}{name}: {problem}, got {kwargs[name]!r}")
    return cls(**kwargs)


def require_positive(cfg: Any, *names: str) -> None:
    """Refuse zero or negative sizes up front (``names`` are fields of ``cfg``), before a
    command writes anything."""
    for name in names:
        value = getattr(cfg, name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not value > 0:
            raise PlasticError(f"config {name} must be > 0, not {value}")


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
_PLURALS = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}


def _type_problem(hint: Any, value: Any) -> str | None:
    """Why ``value`` does not fit the field type ``hint`` (simple types, tuples and lists of
    them, optionals), or None; other hints are not checked."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        return None if any(_type_problem(a, value) is None for a in options) else \
            f"expected {' or '.join(_NAMES.get(a, str(a)) for a in options)}"
    if hint in (tuple, list) or origin in (tuple, list):
        if not isinstance(value, (tuple, list)):
            return "expected a list"
        inner = [a for a in args if a is not Ellipsis]
        if len(inner) == 1:
            bad = [v for v in value if _type_problem(inner[0], v)]
            if bad:
                return f"expected a list of {_PLURALS.get(inner[0], inner[0])}"
        return None
    if hint is bool:
        return None if isinstance(value, bool) else "expected true or false"
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else \
            "expected an integer"
    if hint is float:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else \
            "expected a number"
    if hint is str:
        return None if isinstance(value, str) else "expected a string"
    return None


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
    ``key=value`` overrides."""
    data: dict = {}
    for file in (preset, path):
        if file:
            deep_update(data, read_config_file(file))
    for item in overrides:
        if "=" not in item:
            raise PlasticError(f"override {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        _set_path(data, key.strip(), parse_value(value.strip()))
    return from_dict(cls, data)


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def field_docs(cls: type, prefix: str = "") -> list[tuple[str, Any, str]]:
    """``(dotted key, default, help)`` of every field of dataclass ``cls`` (nested ones
    flattened); the help is the comment written beside the field in the class body."""
    comments: dict[int, tuple[int, str]] = {}   # line -> (column, text)
    try:
        source = inspect.getsource(cls)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip())
        body = ast.parse(source).body[0].body
    except (OSError, TypeError, SyntaxError, IndexError, AttributeError):
        body = []
    helps: dict[str, str] = {}
    code_lines = {n for node in body for n in range(node.lineno, node.end_lineno + 1)}
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            lead, n = [], node.lineno - 1        # comment lines just above, at the field's column
            while n in comments and comments[n][0] == node.col_offset:
                lead.insert(0, comments[n][1])
                n -= 1
            trail, n = [], node.end_lineno       # beside it, and continued below, indented
            while n in comments and (n == node.end_lineno or (
                    n not in code_lines and comments[n][0] > node.col_offset)):
                trail.append(comments[n][1])
                n += 1
            helps[node.target.id] = " ".join(lead + trail)
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name)
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        if dataclasses.is_dataclass(hint):
            out += field_docs(hint, f"{prefix}{f.name}.")
        else:
            out.append((prefix + f.name, default, helps.get(f.name, "")))
    return out


def describe(cls: type) -> str:
    """The ``--set`` keys of ``cls`` with defaults and help, one per line (for ``--help``)."""
    rows = field_docs(cls)
    width = max((len(k) for k, _, _ in rows), default=0)
    return "\n".join(f"  {k:<{width}}  {json.dumps(d) if not isinstance(d, str) else repr(d)}"
                     + (f"  {h}" if h else "") for k, d, h in rows)
