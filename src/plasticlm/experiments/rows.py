"""An experiment's rows as a file (nanoGPT-style overrides): each row a label and dotted
overrides of the experiment's base config, kept in ``configs/experiments/<method>/<name>.toml``
(packaged) or in a file of the user's own.

    [[row]]
    label = "fednl, 3x rounds"
    set = { "method.name" = "fednl", "train.rounds" = { times = 3 } }

A value in ``set`` is a literal, ``{ times = k }`` (k times the base config's value, so a row
scales with the base: "three times the rounds") or ``{ from = "key" }`` (a key of the
experiment's own config, e.g. a share the user sets once for the experiment). A row may say
``trained = false`` (a control: the base as prepared), ``central = true`` (the yardstick
trained centrally) and ``when = "<condition>"`` (kept only where the experiment says the
condition holds). Files are checked whole when loaded: a bad row is refused in one line.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plasticlm.config import PRESETS_DIR, to_dict
from plasticlm.errors import PlasticError

ROW_KEYS = {"label", "set", "trained", "central", "when"}


@dataclass(frozen=True)
class RowSpec:
    """One row as written: ``changes`` maps dotted keys to literals or ``{times|from}``."""

    label: str
    changes: tuple[tuple[str, Any], ...]
    trained: bool = True
    central: bool = False
    when: str = ""


def rows_path(method: str, experiment: str) -> Path:
    """The packaged rows of ``experiment``: ``configs/experiments/<method>/<experiment>.toml``."""
    path = PRESETS_DIR / "experiments" / method / f"{experiment}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.toml"))
        raise PlasticError(f"{method} experiment {experiment!r} has no rows file; experiments "
                           f"with rows: {', '.join(known) or 'none'}")
    return path


def load_rows(path: str | Path, conditions: tuple[str, ...] = ()) -> list[RowSpec]:
    """The rows of the TOML file at ``path``, every one checked (``conditions``: the names a
    row's ``when`` may use)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise PlasticError(f"rows file {path}: {e}") from None
    if set(data) != {"row"} or not isinstance(data["row"], list) or not data["row"]:
        raise PlasticError(f"rows file {path}: expected one or more [[row]] tables and "
                           f"nothing else, got keys {sorted(data)}")
    rows, seen = [], set()
    for n, row in enumerate(data["row"], 1):
        where = f"rows file {path}, row {n}"
        unknown = set(row) - ROW_KEYS
        if unknown:
            raise PlasticError(f"{where}: unknown keys {sorted(unknown)} (known: "
                               f"{', '.join(sorted(ROW_KEYS))})")
        label = row.get("label")
        if not isinstance(label, str) or not label.strip():
            raise PlasticError(f"{where}: needs a label (a non-empty string)")
        if label in seen:
            raise PlasticError(f"{where}: label {label!r} is given twice")
        seen.add(label)
        changes = row.get("set", {})
        if not isinstance(changes, dict):
            raise PlasticError(f"{where} ({label}): set must be a table of dotted keys")
        for key, value in changes.items():
            _check_value(value, f"{where} ({label}), {key}")
        for flag in ("trained", "central"):
            if not isinstance(row.get(flag, False), bool):
                raise PlasticError(f"{where} ({label}): {flag} must be true or false")
        when = row.get("when", "")
        if when and when not in conditions:
            raise PlasticError(f"{where} ({label}): unknown condition {when!r} (known: "
                               f"{', '.join(conditions) or 'none'})")
        rows.append(RowSpec(label, tuple(changes.items()), row.get("trained", True),
                            row.get("central", False), when))
    return rows


def _check_value(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        return
    if set(value) == {"times"} and isinstance(value["times"], int | float) \
            and not isinstance(value["times"], bool) and math.isfinite(value["times"]):
        return
    if set(value) == {"from"} and isinstance(value["from"], str):
        return
    raise PlasticError(f"{where}: a table value is {{ times = <number> }} or "
                       f"{{ from = \"<key>\" }}, not {value!r}")


def _lookup(tree: Mapping, dotted: str, what: str) -> Any:
    node: Any = tree
    for k in dotted.split("."):
        if not isinstance(node, Mapping) or k not in node:
            raise PlasticError(f"{what} has no key {dotted!r}")
        node = node[k]
    return node


def resolve(row: RowSpec, base: Any, experiment: Any) -> tuple[tuple[str, Any], ...]:
    """``row``'s overrides with ``{times}`` taken of config ``base``'s value at the same key
    and ``{from}`` of config ``experiment``'s key."""
    base_tree, exp_tree = to_dict(base), to_dict(experiment)
    out = []
    for key, value in row.changes:
        if isinstance(value, dict) and "times" in value:
            now = _lookup(base_tree, key, "the base config")
            if isinstance(now, bool) or not isinstance(now, int | float):
                raise PlasticError(f"row {row.label!r}: {key} = {now!r} cannot be scaled")
            value = now * value["times"]
            value = int(value) if isinstance(now, int) and float(value).is_integer() else value
        elif isinstance(value, dict):
            value = _lookup(exp_tree, value["from"], "the experiment config")
        out.append((key, value))
    return tuple(out)


def kept(rows: list[RowSpec], holds: Callable[[str], bool]) -> list[RowSpec]:
    """The rows whose condition ``holds`` (each condition asked once, only if a row uses it)."""
    answers: dict[str, bool] = {}
    out = []
    for r in rows:
        if r.when and r.when not in answers:
            answers[r.when] = holds(r.when)
        if not r.when or answers[r.when]:
            out.append(r)
    return out
