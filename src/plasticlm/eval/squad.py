"""SQuAD exact match and token F1 with the official v1.1 answer normalisation."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from plasticlm.errors import PlasticError

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower-case, drop ASCII punctuation, drop articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall of the normalised strings.

    When either side normalises to no tokens, F1 is 1.0 if both do, else 0.0 (as SQuAD v2's
    script; v1.1 gave 0.0 for two empty strings, which would break "EM implies F1 = 1").
    """
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def _gold_texts(golds) -> list[str]:
    if isinstance(golds, str):
        golds = [golds]
    texts = [g["text"] if isinstance(g, dict) else getattr(g, "text", g) for g in golds]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise PlasticError("each question needs at least one gold answer string "
                           "(a str, a {'text': ...} dict or an object with .text)")
    return texts


def squad_score(prediction: str, golds: Sequence[str] | str) -> tuple[float, float]:
    """``(exact_match, f1)`` of one prediction, each the max over the gold answers."""
    texts = _gold_texts(golds)
    return (max(exact_match(prediction, g) for g in texts),
            max(f1_score(prediction, g) for g in texts))


@dataclass
class SquadResult:
    """Mean exact match and F1 in [0, 1] (the official script prints them x100)."""

    exact_match: float
    f1: float
    n: int


def squad_metrics(predictions: Sequence[str], golds: Sequence[Sequence[str]]) -> SquadResult:
    """Mean EM and F1 over questions; ``golds[i]`` holds question i's gold answers."""
    if len(predictions) != len(golds):
        raise PlasticError(f"{len(predictions)} predictions but {len(golds)} gold answer lists")
    if not predictions:
        raise PlasticError("no predictions to score")
    scores = [squad_score(p, g) for p, g in zip(predictions, golds)]
    n = len(scores)
    return SquadResult(sum(s[0] for s in scores) / n, sum(s[1] for s in scores) / n, n)


def squad_metrics_for(items, predictions: Sequence[str]) -> SquadResult:
    """:func:`squad_metrics` for records with an ``.answers`` attribute (strs or dicts)."""
    return squad_metrics(predictions, [_gold_texts(item.answers) for item in items])
