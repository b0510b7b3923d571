"""Control measures: legal-answer rate, closed-set choice scoring and the entity-swap control.

- :func:`legal_answer_rate`: how often a generation is one of the closed set of legal values
  at all (a model may learn the answer format before the facts).
- :func:`closed_set_accuracy`: a generation task scored as multiple choice, ranking every legal
  value by log-likelihood; chance is one over the number of values.
- :func:`entity_swap_control`: the same questions about unseen entities; what accuracy
  remains is what the template and the value set give away without knowing the entity.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from plasticlm.eval.encoding import encode_pair, pad_id_of
from plasticlm.eval.prompts import qa_continuation
from plasticlm.eval.scoring import score_continuations
from plasticlm.eval.squad import normalize_answer

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CausalLM: TypeAlias = "PreTrainedModel"
Tokenizer: TypeAlias = "PreTrainedTokenizerBase"

_BREAK = re.escape(string.punctuation)


def _value_sets(value_sets, n: int, name: str) -> list[list[str]]:
    """One list of values per item from a shared list of strings or a list of per-item lists."""
    sets = list(value_sets)
    if sets and all(isinstance(v, str) for v in sets):
        sets = [sets] * n
    elif len(sets) != n:
        raise ValueError(f"{name}: give one shared list of values or one list per item; got "
                         f"{len(sets)} lists for {n} items")
    out = [[str(v) for v in values] for values in sets]
    if any(not values for values in out):
        raise ValueError(f"{name}: every item needs at least one legal value")
    return out


def _legal_pattern(value: str) -> re.Pattern:
    words = r"\s+".join(re.escape(w) for w in value.split())
    return re.compile(rf"\s*(?:(?:a|an|the)\s+)?{words}\s*(?:[{_BREAK}\n]|$)", re.IGNORECASE)


def is_legal(prediction: str, legal_values: Sequence[str]) -> bool:
    """Whether ``prediction`` is a legal value: its normalised text equals a normalised value
    (:func:`normalize_answer`), or it starts with a value followed by punctuation, a newline
    or its end ("blue. The sky" is legal, "blue green" is not)."""
    values = [str(v) for v in legal_values]
    if not values:
        raise ValueError("legal_values is empty: give the closed set of legal answers")
    norm = normalize_answer(prediction)
    if any(norm == normalize_answer(v) for v in values):
        return True
    return any(_legal_pattern(v).match(prediction) for v in values if v.strip())


def legal_answer_rate(predictions: Sequence[str], legal_values) -> float:
    """Fraction of ``predictions`` [n] that are legal (see :func:`is_legal`).

    ``legal_values`` is one list of strings shared by all items or one list per item [n].
    """
    if len(predictions) == 0:
        raise ValueError("no predictions to check")
    sets = _value_sets(legal_values, len(predictions), "legal_values")
    return sum(is_legal(p, v) for p, v in zip(predictions, sets)) / len(predictions)


@dataclass(frozen=True)
class ClosedSetResult:
    """Per item: the chosen value's index, correctness (1.0/0.0) and chance (1 / #values)."""

    choices: tuple[int, ...]
    correct: tuple[float, ...]
    chance: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.correct)

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / self.n

    @property
    def chance_accuracy(self) -> float:
        return sum(self.chance) / self.n


def closed_set_choice(model: CausalLM, tokenizer: Tokenizer, prompts: Sequence[str],
                      value_sets, batch_size: int = 32) -> list[int]:
    """Index of the value ranked first after each prompt [n] by total log-likelihood.

    Each legal value is scored as the continuation ``" " + value`` of the prompt (trailing
    spaces of the prompt are dropped, so "A:" and "A: " read alike); ties go to the first.
    ``value_sets``: one shared list of strings or one list per prompt.
    """
    if len(prompts) == 0:
        raise ValueError("no prompts to score")
    sets = _value_sets(value_sets, len(prompts), "value_sets")
    contexts, conts = [], []
    for prompt, values in zip(prompts, sets):
        for value in values:
            ctx, cont = encode_pair(tokenizer, prompt.rstrip(" "), qa_continuation(value.strip()))
            contexts.append(ctx)
            conts.append(cont)
    scored = score_continuations(model, contexts, conts, pad_id_of(tokenizer), batch_size)
    out, pos = [], 0
    for values in sets:
        row = [s.logprob for s in scored[pos : pos + len(values)]]
        out.append(max(range(len(row)), key=row.__getitem__))
        pos += len(values)
    return out


def closed_set_accuracy(model: CausalLM, tokenizer: Tokenizer, prompts: Sequence[str],
                        value_sets, answers: Sequence[int | str], batch_size: int = 32
                        ) -> ClosedSetResult:
    """:func:`closed_set_choice` against ``answers`` [n], each an index into its values or a
    value (matched after :func:`normalize_answer`)."""
    if len(answers) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
    sets = _value_sets(value_sets, len(prompts), "value_sets")
    gold = [_answer_index(a, values) for a, values in zip(answers, sets)]
    choices = closed_set_choice(model, tokenizer, prompts, sets, batch_size)
    return ClosedSetResult(tuple(choices),
                           tuple(float(c == g) for c, g in zip(choices, gold)),
                           tuple(1 / len(values) for values in sets))


def _answer_index(answer: int | str, values: list[str]) -> int:
    if isinstance(answer, int) and not isinstance(answer, bool):
        if not 0 <= answer < len(values):
            raise ValueError(f"answer index {answer} is outside 0..{len(values) - 1}")
        return answer
    norms = [normalize_answer(v) for v in values]
    key = normalize_answer(str(answer))
    if key not in norms:
        raise ValueError(f"answer {answer!r} is not one of the legal values {values}")
    return norms.index(key)


def _entity_pattern(entity: str) -> re.Pattern:
    words = entity.split()
    if not words:
        raise ValueError("the entity name is empty")
    body = r"\s+".join(re.escape(w) for w in words)
    return re.compile(rf"(?<!\w){body}(?!\w)", re.IGNORECASE)


def _match_case(found: str, entity: str, replacement: str) -> str:
    """``replacement`` cased the way ``found`` differs from the canonical ``entity``."""
    if found == entity:
        return replacement
    if found.isupper() and not entity.isupper():
        return replacement.upper()
    if found.islower() and not entity.islower():
        return replacement.lower()
    if found[:1].isupper() and entity[:1].islower():
        words = found.split()
        if len(words) > 1 and all(w[:1].isupper() for w in words):  # "Corvell Act"
            return " ".join(w[:1].upper() + w[1:] for w in replacement.split(" "))
        return replacement[:1].upper() + replacement[1:]  # sentence start
    return replacement


def swap_entity(text: str, entity: str, replacement: str) -> str:
    """``text`` with every whole-word occurrence of ``entity`` replaced, case preserved.

    Matching ignores case and spacing between the name's words; "zenly" is not found in
    "zenlyx". An occurrence cased unlike ``entity`` ("Zenly" at a sentence start, "ZENLY")
    gets ``replacement`` cased alike. Raises ValueError when ``entity`` does not occur.
    """
    pattern = _entity_pattern(entity)
    entity = " ".join(entity.split())
    out, count = pattern.subn(
        lambda m: _match_case(" ".join(m.group(0).split()), entity, replacement), text)
    if count == 0:
        raise ValueError(f"entity {entity!r} does not occur in {text!r} as a whole word")
    return out


@dataclass(frozen=True)
class SwappedItem:
    """A question about ``entity`` (unseen) made from one about ``original``; same answer."""

    question: str
    entity: str
    answer: str
    original: str


def entity_swap_control(items, replacements: Sequence[str] | Mapping[Hashable, Sequence[str]],
                        seed: int = 0, kind_of: Callable[[object], Hashable] | None = None
                        ) -> list[SwappedItem]:
    """Each item (``.question``, ``.entity``, ``.answer``) asked about an unseen name instead.

    ``replacements`` is one list of unseen names, or a mapping from kind to names with
    ``kind_of(item)`` giving each item's kind. Each entity gets one name for all its items;
    names are dealt from a list shuffled by ``seed`` and reused only when a kind has more
    entities than names. Names equal to an item's entity are never used.
    """
    items = list(items)
    if not items:
        raise ValueError("no items to swap")
    if isinstance(replacements, Mapping) != (kind_of is not None):
        raise ValueError("give kind_of together with a mapping of replacements (kind -> "
                         "names), and neither with a plain list of names")
    pools = replacements if isinstance(replacements, Mapping) else {None: replacements}
    seen = {normalize_answer(str(i.entity)) for i in items}
    decks: dict[Hashable, list[str]] = {}
    for kind, names in pools.items():
        deck = [str(n) for n in names if normalize_answer(str(n)) not in seen]
        random.Random(f"{seed}:{kind!r}").shuffle(deck)  # one stream per kind
        decks[kind] = deck
    assigned: dict[tuple[Hashable, str], str] = {}
    dealt = dict.fromkeys(decks, 0)
    out = []
    for k, item in enumerate(items):
        kind = kind_of(item) if kind_of is not None else None
        if kind not in decks:
            raise ValueError(f"item {k}: no replacement names for kind {kind!r}")
        deck = decks[kind]
        if not deck:
            raise ValueError(f"no unseen replacement names for kind {kind!r}: every name "
                             "given is also an item's entity")
        key = (kind, str(item.entity))
        if key not in assigned:
            assigned[key] = deck[dealt[kind] % len(deck)]
            dealt[kind] += 1
        name = assigned[key]
        try:
            question = swap_entity(str(item.question), str(item.entity), name)
        except ValueError as err:
            raise ValueError(f"item {k}: {err}") from None
        out.append(SwappedItem(question, name, str(item.answer), str(item.entity)))
    return out
