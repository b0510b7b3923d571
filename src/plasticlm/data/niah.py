"""RULER-style needle-in-a-haystack samples: seven retrieval tasks, exact scoring per task.

A sample is a haystack (sentences from essays or world text) with needles inserted at a
chosen depth, and a question whose answers are strings that appear verbatim in the needles.
Lengths are measured in tokens of a given tokenizer, or in whitespace words when none.
"""

from __future__ import annotations

import random
import re
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from plasticlm.data.records import Document
from plasticlm.errors import PlasticError

Task = Literal["single", "multikey", "multivalue", "multiquery", "uuid", "numeric", "vartrack"]
TASKS: tuple[str, ...] = typing.get_args(Task)

_ADJ = ("amber", "silent", "crimson", "hollow", "bright", "frozen", "gentle", "rapid", "golden",
        "misty", "quiet", "rustic", "velvet", "wild", "ashen", "lunar", "sable", "tidal")
_NOUN = ("falcon", "river", "lantern", "meadow", "harbor", "compass", "orchard", "glacier",
         "violin", "thistle", "beacon", "canyon", "quill", "ember", "willow", "anchor", "summit")


@dataclass(frozen=True)
class NIAHConfig:
    """How one sample is built. ``length`` counts tokens (or words); ``depth`` is in [0, 1].
    A plain frozen dataclass (``data`` imports nothing of the package but ``errors``), its
    fields checked here."""

    task: Task = "single"
    length: int = 1024
    depth: float = 0.5
    num_distractors: int = 3     # multikey: other keys with their own needles
    num_values: int = 4          # multivalue: values written for the one key
    num_queries: int = 2         # multiquery: keys asked at once (of num_queries + 2 needles)
    chain_length: int = 4        # vartrack: variables that end up holding the value

    def __post_init__(self):
        if self.task not in TASKS:
            raise PlasticError(f"unknown NIAH task {self.task!r}; choose one of "
                               f"{', '.join(TASKS)}")
        if not isinstance(self.depth, int | float) or isinstance(self.depth, bool) \
                or not 0.0 <= self.depth <= 1.0:
            raise PlasticError(f"needle depth {self.depth!r} is outside [0, 1]")
        for name, least in (("length", 1), ("num_distractors", 0), ("num_values", 1),
                            ("num_queries", 1), ("chain_length", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise PlasticError(f"NIAH {name} must be a whole number >= {least}, not "
                                   f"{value!r}")


@dataclass
class NIAHSample:
    """One sample; the model sees :attr:`prompt` and must produce every string in ``answers``."""

    id: str
    task: str
    context: str
    question: str
    answers: list[str]
    length: int
    depth: float
    unit: str = "words"
    meta: dict = field(default_factory=dict)

    @property
    def prompt(self) -> str:
        return f"{self.context}\n{self.question}\nAnswer:"

    @property
    def target(self) -> str:
        """The reference completion (answers joined), used to build training drills."""
        return " " + ", ".join(self.answers) + "."


def haystack_sentences(docs: Sequence[Document | str]) -> list[str]:
    """Split documents into sentences (on ., ! or ? followed by space), whitespace-normalised."""
    out = []
    for d in docs:
        text = d.text if isinstance(d, Document) else d
        for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
            if len(s.split()) >= 3:
                out.append(s)
    if not out:
        raise PlasticError("the haystack has no sentences of three words or more")
    return out


def _key(rng: random.Random, used: set[str]) -> str:
    while True:
        k = f"{rng.choice(_ADJ)}-{rng.choice(_NOUN)}"
        if k not in used:
            used.add(k)
            return k


def _number(rng: random.Random, used: set[str], digits: int = 5) -> str:
    while True:
        v = str(rng.randrange(10 ** (digits - 1), 10**digits))
        if v not in used:
            used.add(v)
            return v


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def magic_number_needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def _needles(cfg: NIAHConfig, rng: random.Random) -> tuple[list[str], list[str], str, list[str]]:
    """(target needles, distractor needles, question, answers) for ``cfg.task``."""
    keys: set[str] = set()
    nums: set[str] = set()
    t = cfg.task
    if t in ("single", "multikey"):
        k, v = _key(rng, keys), _number(rng, nums)
        others = [(_key(rng, keys), _number(rng, nums))
                  for _ in range(cfg.num_distractors if t == "multikey" else 0)]
        return ([magic_number_needle(k, v)], [magic_number_needle(*o) for o in others],
                f"What is the special magic number for {k} mentioned in the text?", [v])
    if t == "multivalue":
        k = _key(rng, keys)
        vals = [_number(rng, nums) for _ in range(cfg.num_values)]
        return ([magic_number_needle(k, v) for v in vals], [],
                f"What are all the special magic numbers for {k} mentioned in the text?", vals)
    if t == "multiquery":
        pairs = [(_key(rng, keys), _number(rng, nums)) for _ in range(cfg.num_queries + 2)]
        asked = pairs[: cfg.num_queries]
        return ([magic_number_needle(k, v) for k, v in asked],
                [magic_number_needle(k, v) for k, v in pairs[cfg.num_queries:]],
                "What are the special magic numbers for " + " and ".join(k for k, _ in asked)
                + " mentioned in the text?", [v for _, v in asked])
    if t == "uuid":
        k, v = _key(rng, keys), _uuid(rng)
        return ([f"One of the special magic uuids for {k} is: {v}."], [],
                f"What is the special magic uuid for {k} mentioned in the text?", [v])
    if t == "numeric":
        k = _key(rng, keys)
        v = f"{rng.randrange(10, 1000)}.{rng.randrange(10, 100)}"
        return ([f"The measured weight of the {k} sample is {v} grams."], [],
                f"What is the measured weight of the {k} sample in grams?", [v])
    if t == "vartrack":
        value = _number(rng, nums)
        names: list[str] = []
        while len(names) < cfg.chain_length + 2:
            n = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(3))
            if n not in names:
                names.append(n)
        chain, decoys = names[: cfg.chain_length], names[cfg.chain_length:]
        needles = [f"VAR {chain[0]} = {value}."]
        needles += [f"VAR {chain[i]} = VAR {chain[i - 1]}." for i in range(1, len(chain))]
        other = _number(rng, nums)
        distract = [f"VAR {decoys[0]} = {other}.", f"VAR {decoys[1]} = VAR {decoys[0]}."]
        return (needles, distract,
                f"Which variables are assigned the value {value}, directly or through other "
                "variables?", chain)
    raise PlasticError(f"unknown NIAH task {t!r}; choose one of {', '.join(TASKS)}")


def _counter(tokenizer) -> tuple[Callable[[str], int], str]:
    if tokenizer is None:
        return (lambda s: len(s.split())), "words"
    return (lambda s: len(tokenizer(s, add_special_tokens=False)["input_ids"])), "tokens"


def make_sample(cfg: NIAHConfig, sentences: Sequence[str], seed: int = 0, tokenizer=None,
                sample_id: str | None = None) -> NIAHSample:
    """One sample of ``cfg.task`` whose prompt is about ``cfg.length`` tokens (or words).

    The target needle sits at relative depth ``cfg.depth`` of the haystack; further target
    needles (multivalue, multiquery, vartrack chains, in order) and distractors are spread
    at random sentence boundaries after or around it.
    """
    if not sentences:
        raise PlasticError("an empty haystack: give essays or world text")
    rng = random.Random(seed)
    targets, distractors, question, answers = _needles(cfg, rng)
    count, unit = _counter(tokenizer)
    budget = cfg.length - count(question + " Answer:") - sum(count(n) for n in targets + distractors)
    if budget < 8:
        raise PlasticError(f"length {cfg.length} {unit} is too short for a {cfg.task} sample; "
                           "use a longer length")
    hay: list[str] = []
    used = 0
    i = rng.randrange(len(sentences))
    while True:
        s = sentences[i % len(sentences)]
        n = count(s) + (0 if unit == "words" else 1)
        if used + n > budget:
            break
        hay.append(s)
        used += n
        i += 1
    # Needle positions as fractions of the haystack, so that trimming keeps them in place.
    # The first target sits at the chosen depth; later targets follow it.
    fracs = [cfg.depth] + [rng.uniform(cfg.depth, 1.0) for _ in targets[1:]]
    if cfg.task == "vartrack":
        fracs = sorted(fracs)  # a chain must be readable front to back
    fracs += [rng.random() for _ in distractors]
    needles = targets + distractors
    # values the context states for other keys: the wrong options that test key binding
    decoys = [re.search(r"is: (\S+)\.$", d).group(1) for d in distractors
              if cfg.task in ("multikey", "multiquery")]

    def build(hay: list[str]) -> NIAHSample:
        pieces = list(hay)
        slots = [(round(f * len(hay)), j) for j, f in enumerate(fracs)]
        for slot, j in sorted(slots, reverse=True):
            pieces.insert(slot, needles[j])
        sample = NIAHSample(sample_id or f"{cfg.task}-{cfg.length}-{seed}", cfg.task,
                            " ".join(pieces), question, answers, 0, cfg.depth, unit,
                            {"decoys": decoys} if decoys else {})
        sample.length = count(sample.prompt)
        return sample

    # Sentence-wise estimates leave a gap (a long sentence that did not fit) or overshoot by
    # a few tokens at joins: close it with word fragments, measured on the whole prompt.
    sample = build(hay)
    for _ in range(12):
        gap = cfg.length - sample.length
        if gap < 0 and hay:
            words = hay[-1].split()
            drop = min(len(words), -gap)
            hay = hay[:-1] + ([" ".join(words[:-drop])] if drop < len(words) else [])
        elif gap > max(1, cfg.length // 100):
            words = sentences[i % len(sentences)].split()
            i += 1
            take = gap if unit == "words" else max(1, gap // 2)
            hay.append(" ".join(words[:take]))
        else:
            break
        sample = build(hay)
    # The estimate above can oscillate around the target: finish by dropping single words.
    while sample.length > cfg.length and hay:
        words = hay[-1].split()
        hay = hay[:-1] + ([" ".join(words[:-1])] if len(words) > 1 else [])
        sample = build(hay)
    if not hay or sample.length > cfg.length:
        raise PlasticError(f"could not fit a {cfg.task} sample into {cfg.length} {unit}; "
                           "use a longer length")
    return sample


def generate_niah(task: str, n: int, length: int, sentences: Sequence[str], seed: int = 0,
                  tokenizer=None, depths: Sequence[float] | None = None,
                  **options) -> list[NIAHSample]:
    """``n`` samples of ``task``; depths cycle through ``depths`` (default 0, 0.25, ... 1)."""
    depths = list(depths) if depths is not None else [0.0, 0.25, 0.5, 0.75, 1.0]
    return [make_sample(NIAHConfig(task, length, depths[i % len(depths)], **options), sentences,
                        seed=seed * 100_003 + i, tokenizer=tokenizer,
                        sample_id=f"{task}-{length}-{seed}-{i}") for i in range(n)]


def _contains(ref: str, prediction: str) -> bool:
    return ref.lower() in prediction.lower()


def score_all_or_nothing(sample: NIAHSample, prediction: str) -> float:
    """1.0 when every answer string appears in the prediction, else 0.0."""
    return float(all(_contains(a, prediction) for a in sample.answers))


def score_recall(sample: NIAHSample, prediction: str) -> float:
    """Fraction of the answer strings that appear in the prediction (RULER string_match_all)."""
    return sum(_contains(a, prediction) for a in sample.answers) / len(sample.answers)


SCORERS: dict[str, Callable[[NIAHSample, str], float]] = {
    "single": score_all_or_nothing, "multikey": score_all_or_nothing,
    "uuid": score_all_or_nothing, "numeric": score_all_or_nothing,
    "multivalue": score_recall, "multiquery": score_recall, "vartrack": score_recall,
}


def score(sample: NIAHSample, prediction: str) -> float:
    """The task's exact score of ``prediction`` (the model's generated text) in [0, 1]."""
    if sample.task not in SCORERS:
        raise PlasticError(f"unknown NIAH task {sample.task!r}; choose one of {', '.join(TASKS)}")
    return SCORERS[sample.task](sample, prediction)
