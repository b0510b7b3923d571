"""Needle-in-a-haystack scoring: the fraction of expected values a response recovers."""

from __future__ import annotations

import re
from collections.abc import Sequence

from plasticlm.errors import PlasticError

MODES = ("contains", "exact")
_ITEM_SPLIT = re.compile(r"[\s,;]+")
_EDGE_PUNCT = "\"'`.,;:!?()[]{}<>"


def response_items(response: str) -> list[str]:
    """The items of a response: split on whitespace, commas and semicolons, edges stripped."""
    items = (p.strip(_EDGE_PUNCT) for p in _ITEM_SPLIT.split(response))
    return [p.lower() for p in items if p]


def niah_score(response: str, expected: Sequence[str] | str, mode: str = "contains") -> float:
    """Fraction of ``expected`` values found in ``response`` (case-insensitive).

    ``contains``: the value occurs anywhere as a substring (RULER's string match);
    ``exact``: the value's items occur as consecutive whole items of the response (see
    :func:`response_items`), so "12" does not count as found in "123".
    """
    if mode not in MODES:
        raise PlasticError(f"unknown NIAH scoring mode {mode!r}; choose one of {', '.join(MODES)}")
    values = [expected] if isinstance(expected, str) else list(expected)
    if not values:
        raise PlasticError("a NIAH question needs at least one expected value")
    if mode == "contains":
        text = response.lower()
        found = [v.lower() in text for v in values]
    else:
        items = response_items(response)
        found = [_contains_run(items, response_items(v)) for v in values]
    return sum(found) / len(values)


def niah_accuracy(responses: Sequence[str], expected: Sequence[Sequence[str] | str],
                  mode: str = "contains") -> float:
    """Mean :func:`niah_score` over questions."""
    if len(responses) != len(expected):
        raise PlasticError(f"{len(responses)} responses but {len(expected)} expected-value lists")
    if not responses:
        raise PlasticError("no responses to score")
    return sum(niah_score(r, e, mode) for r, e in zip(responses, expected)) / len(responses)


def _contains_run(items: list[str], run: list[str]) -> bool:
    n = len(run)
    return n > 0 and any(items[i : i + n] == run for i in range(len(items) - n + 1))
