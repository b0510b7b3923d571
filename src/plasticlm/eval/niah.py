"""Needle-in-a-haystack scoring: the fraction of expected values a response recovers
(:func:`niah_score`), and whether a model reads the needle at all, by choice among decoys
(:func:`niah_choice`)."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from plasticlm.errors import PlasticError
from plasticlm.eval.encoding import encode_pair, pad_id_of
from plasticlm.eval.scoring import score_continuations

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


def same_format_decoy(value: str, rng: random.Random) -> str:
    """A random string shaped like ``value``: digits stay digits, hex letters hex letters."""
    out = []
    for ch in value:
        if ch.isdigit():
            out.append(rng.choice("0123456789"))
        elif ch in "abcdef":
            # letters stay letters: a decoy with more digits than the needle out-scores it
            # under a model that merely likes digits (uuid fell to 0-17%, below chance)
            out.append(rng.choice("abcdef"))
        else:
            out.append(ch)
    return "".join(out)


def niah_choice(model, tokenizer, samples, num_choices: int = 4, seed: int = 0) -> list[float]:
    """Per sample, 1.0 when the needle's first answer out-scores ``num_choices - 1`` decoys
    after the prompt (chance ``1/num_choices``): whether the model reads the needle at all
    even when it cannot copy it token for token. Decoys are first the values the context
    states for other keys (multi-key: choosing the right one needs the key, not just "a
    number from the text"), then random strings of the answer's format (digits stay
    digits) or, for word answers, other samples' answers."""
    rng = random.Random(seed)
    pool = sorted({a for s in samples for a in s.answers})
    contexts, conts = [], []
    for s in samples:
        true = s.answers[0]
        in_context = [d for d in getattr(s, "meta", {}).get("decoys", ()) if d not in s.answers]
        options = [true, *in_context[: num_choices - 1]]
        for _ in range(20 * num_choices):  # words have no digits to vary: few or no decoys
            fake = same_format_decoy(true, rng)
            if len(options) == num_choices:
                break
            if fake not in options and fake not in s.answers:
                options.append(fake)
        others = [a for a in pool if a not in options and a not in s.answers]
        options += rng.sample(others, min(len(others), num_choices - len(options)))
        if len(options) < num_choices:
            raise PlasticError(f"cannot find {num_choices - 1} decoys for the needle {true!r}: "
                               "give more samples or fewer choices")
        for o in options:
            ctx, cont = encode_pair(tokenizer, s.prompt, " " + o)
            contexts.append(ctx)
            conts.append(cont)
    scored = score_continuations(model, contexts, conts, pad_id_of(tokenizer), 16, "right")
    out = []
    for i in range(len(samples)):
        group = [x.logprob for x in scored[i * num_choices:(i + 1) * num_choices]]
        out.append(float(max(range(num_choices), key=group.__getitem__) == 0))
    return out
