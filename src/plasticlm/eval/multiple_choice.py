"""Multiple-choice accuracy by answer-letter scoring, by continuation scoring, or by generation.

- ``letters``: MMLU-style prompt ("question, A. .., B. .., Answer:"), pick the letter whose
  " A"/" B"/.. has the highest log-probability.
- ``continuation``: the QA prompt "Q: .. A:" of :mod:`plasticlm.eval.prompts` (the
  pre-training format), pick the choice text whose continuation " <choice>" has the highest
  log-probability (summed, or per token); small models answer this way far better than by
  letters.
- ``generate``: greedy generation after the MMLU-style prompt, letter extracted by regex.
"""

from __future__ import annotations

import re
import string
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from plasticlm.config import Field, configclass
from plasticlm.errors import PlasticError
from plasticlm.eval.encoding import encode_pair, pad_id_of
from plasticlm.eval.generation import generate_texts
from plasticlm.eval.prompts import QA_TEMPLATE, qa_continuation
from plasticlm.eval.scoring import score_continuations

LETTERS = string.ascii_uppercase
Method = Literal["letters", "continuation", "generate"]
Normalisation = Literal["sum", "mean"]
MC_METHODS = typing.get_args(Method)
NORMALISATIONS = typing.get_args(Normalisation)


@configclass
class MCConfig:
    """How to score multiple-choice questions (see the module docstring for ``method``)."""

    method: Method = Field("letters", description="how a choice is picked (module docstring)")
    batch_size: int = Field(8, gt=0, description="prompts per forward pass")
    padding_side: Literal["right", "left"] = Field("right", description="where a batch's "
                                                   "prompts are padded")
    normalise: Normalisation = Field("sum", description="continuation: sum of the token "
                                     "log-probs, or their per-token mean")
    subject: str | None = Field(None, description="MMLU header 'The following are ... about "
                                "<subject>.'")
    continuation_template: str = Field(QA_TEMPLATE, description="continuation: the prompt, "
                                       "with a {question} field (default: the one QA template)")
    max_new_tokens: int = Field(16, gt=0, description="generate: tokens generated at most")


@dataclass
class MCResult:
    """Accuracy and per-question predictions (None: no letter found in a generation)."""

    method: str
    accuracy: float
    n: int
    predictions: list[int | None] = field(repr=False)
    correct: list[bool] = field(repr=False)
    scores: list[list[float]] | None = field(default=None, repr=False)


def answer_index(answer: int | str, num_choices: int) -> int:
    """0-based index of an answer given as an index or a letter ("B" -> 1)."""
    if isinstance(answer, str):
        key = answer.strip().upper()
        idx = LETTERS.index(key) if len(key) == 1 and key in LETTERS else -1
    elif isinstance(answer, int) and not isinstance(answer, bool):
        idx = answer
    else:
        idx = -1
    if not 0 <= idx < num_choices:
        raise PlasticError(f"answer {answer!r} is not a choice index in [0, {num_choices}) nor "
                           f"a letter in A-{LETTERS[num_choices - 1]}")
    return idx


def mmlu_prompt(question: str, choices: Sequence[str], subject: str | None = None) -> str:
    """MMLU-style prompt: optional subject header, question, lettered choices, "Answer:"."""
    _check_choices(choices)
    head = ""
    if subject:
        head = (f"The following are multiple choice questions (with answers) about "
                f"{subject.replace('_', ' ')}.\n\n")
    lines = [f"{LETTERS[i]}. {c}" for i, c in enumerate(choices)]
    return head + question.strip() + "\n" + "\n".join(lines) + "\nAnswer:"


def _check_choices(choices: Sequence[str]) -> None:
    if not 2 <= len(choices) <= len(LETTERS):
        raise PlasticError(f"a question needs 2 to {len(LETTERS)} choices, not {len(choices)}")


def _choice_patterns(num_choices: int) -> tuple[re.Pattern, re.Pattern]:
    letters = f"[A-{LETTERS[num_choices - 1]}]"
    return (re.compile(rf"answer is:?\s*\(?({letters})\)?(?![A-Za-z])", re.IGNORECASE),
            re.compile(rf"^\s*\(?({letters})\)?(?:[.):\s]|$)"))


def extract_choice(text: str, num_choices: int = 4) -> int | None:
    """Choice index from generated text, or None.

    First "The correct answer is (B)" / "answer is B" anywhere, else a bare letter at the
    start ("B", " B.", "(B)"). Letters elsewhere are ignored: "A" is also an English word.
    """
    if not 2 <= num_choices <= len(LETTERS):
        raise PlasticError(f"num_choices must be in 2..{len(LETTERS)}, not {num_choices}")
    phrase, bare = _choice_patterns(num_choices)
    found = phrase.search(text) or bare.match(text)
    return LETTERS.index(found.group(1).upper()) if found else None


def choice_scores(model, tokenizer, questions: Sequence[str],
                  choices: Sequence[Sequence[str]], config: MCConfig | None = None
                  ) -> list[list[float]]:
    """Per question, one score per choice (higher = preferred) by ``letters``/``continuation``."""
    config = config or MCConfig()
    if config.method not in ("letters", "continuation"):
        raise PlasticError(f"choice_scores needs method 'letters' or 'continuation', "
                           f"not {config.method!r}")
    contexts, conts, owners = [], [], []
    for q, opts in zip(questions, choices, strict=True):
        _check_choices(opts)
        if config.method == "letters":
            prompt = mmlu_prompt(q, opts, config.subject)
            pieces = [f" {LETTERS[i]}" for i in range(len(opts))]
        else:
            prompt = config.continuation_template.format(question=q.strip())
            pieces = [qa_continuation(str(o).strip()) for o in opts]
        for piece in pieces:
            ctx, cont = encode_pair(tokenizer, prompt, piece)
            contexts.append(ctx)
            conts.append(cont)
        owners.append(len(pieces))
    scored = score_continuations(model, contexts, conts, pad_id_of(tokenizer),
                                 config.batch_size, config.padding_side)
    values = [s.mean_logprob if config.normalise == "mean" and config.method == "continuation"
              else s.logprob for s in scored]
    out, pos = [], 0
    for n in owners:
        out.append(values[pos : pos + n])
        pos += n
    return out


def evaluate_mc(model, tokenizer, questions: Sequence[str], choices: Sequence[Sequence[str]],
                answers: Sequence[int | str], config: MCConfig | None = None) -> MCResult:
    """Multiple-choice accuracy of ``model`` by ``config.method``; answers as index or letter."""
    config = config or MCConfig()
    if not (len(questions) == len(choices) == len(answers)):
        raise PlasticError(f"{len(questions)} questions, {len(choices)} choice lists and "
                           f"{len(answers)} answers: they must be equally many")
    if not questions:
        raise PlasticError("no questions to evaluate")
    gold = [answer_index(a, len(c)) for a, c in zip(answers, choices)]
    scores = None
    if config.method == "generate":
        prompts = [mmlu_prompt(q, c, config.subject) for q, c in zip(questions, choices)]
        texts = generate_texts(model, tokenizer, prompts, config.max_new_tokens,
                               config.batch_size, stop=("\n",))
        preds = [extract_choice(t, len(c)) for t, c in zip(texts, choices)]
    else:
        scores = choice_scores(model, tokenizer, questions, choices, config)
        preds = [max(range(len(s)), key=s.__getitem__) for s in scores]
    correct = [p == g for p, g in zip(preds, gold)]
    return MCResult(config.method, sum(correct) / len(correct), len(correct), preds, correct,
                    scores)


def evaluate_mc_items(model, tokenizer, items, config: MCConfig | None = None) -> MCResult:
    """:func:`evaluate_mc` for records with ``.question``, ``.choices`` and ``.answer``."""
    items = list(items)
    return evaluate_mc(model, tokenizer, [i.question for i in items],
                       [list(i.choices) for i in items], [i.answer for i in items], config)
