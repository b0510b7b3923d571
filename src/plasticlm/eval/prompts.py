"""The one question-answer prompt template: how questions are put to every model here.

It is the sandbox world's pre-training format, so a model is asked in the form it learned:

- a question prompt is ``Q: <question> A:`` (:func:`qa_prompt`, :data:`QA_TEMPLATE`);
- a Q/A line of the corpus is ``Q: <question> A: <answer>.`` (:func:`qa_line`);
- an answer continues the prompt after one space: a multiple-choice option or a closed-set
  value is scored as the continuation ``" " + choice`` (:func:`qa_continuation`), and a
  generated answer is the text after ``A:`` up to the first newline or full stop.

So ``qa_line(q, a) == qa_prompt(q) + qa_continuation(a) + "."``. Multiple-choice scoring
(:class:`plasticlm.eval.MCConfig`, ``method="continuation"``), FedNL's clients, FedRefine's
experiment and SCoL's closed-book questions all build their prompts here. The lettered MMLU
format (:func:`plasticlm.eval.mmlu_prompt`) is a different method and stays separate.

This module depends on nothing else in the package.
"""

from __future__ import annotations

QA_TEMPLATE = "Q: {question} A:"


def qa_prompt(question: str) -> str:
    """``Q: <question> A:``; the question is used as given (callers strip if they need to)."""
    return QA_TEMPLATE.format(question=question)


def context_prompt(context: str, question: str) -> str:
    """A question asked after its evidence: ``<context>\nQ: <question> A:`` (an open-book
    item, :class:`plasticlm.data.context_tasks.OpenBookItem`)."""
    return f"{context}\n{qa_prompt(question)}"


def qa_continuation(answer: str) -> str:
    """The continuation an answer is scored as after :func:`qa_prompt`: ``" " + answer``."""
    return " " + answer


def qa_line(question: str, answer: str) -> str:
    """One Q/A line of the pre-training corpus: ``Q: <question> A: <answer>.``"""
    return qa_prompt(question) + qa_continuation(answer) + "."
