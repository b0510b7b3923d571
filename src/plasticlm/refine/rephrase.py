"""Privacy by rephrasing: the prompt is reworded on the device before any cache is built.

A local LM is asked to rephrase; its answer is accepted only when it is non-empty, differs
from the prompt and keeps every name (capitalised word past the first) of the prompt.
Otherwise a deterministic rule-based rewrite is used: question openings are turned around,
common words replaced by synonyms, so that the same meaning travels in other tokens.
"""

from __future__ import annotations

import re

from plasticlm.eval import generate_texts

REPHRASE_PROMPT = "Rewrite the question in other words, same meaning.\nQuestion: {text}\nRewritten:"

# Whole-question patterns first (they move words around), then word synonyms.
_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"What condition is (.+?) used to treat\?", r"For which illness do doctors give \1?"),
    (r"Which company makes (.+?)\?", r"Name the firm that produces \1."),
    (r"Which organ does (.+?) act on\?", r"On what body part does \1 work?"),
    (r"In which language is (.+?) written\?", r"Tell me the programming language of \1."),
    (r"What is the (.+?) library used for\?", r"For what job do coders use \1?"),
    (r"Under which license is (.+?) released\?", r"Tell me the licence of \1."),
    (r"Where was (.+?) born\?", r"Name the birth town of \1."),
    (r"What was the profession of (.+?)\?", r"Tell me the job of \1."),
    (r"Which movement did (.+?) belong to\?", r"Name the school of art of \1."),
    (r"Which country passed (.+?)\?", r"Name the nation that enacted \1."),
)
_SYNONYMS = {
    "what": "which thing", "which": "what", "where": "in what place", "who": "which person",
    "when": "at what time", "is": "happens to be", "was": "had been", "does": "do",
    "used": "employed", "make": "produce", "makes": "produces", "company": "firm",
    "country": "nation", "born": "brought into the world", "language": "tongue",
    "written": "coded", "released": "published", "treat": "cure", "question": "query",
    "answer": "reply", "the": "that", "a": "one", "of": "from", "in": "inside",
}


def _names(text: str) -> set[str]:
    words = re.findall(r"[A-Za-z][\w'-]*", text)
    return {w for w in words[1:] if w[0].isupper()} - {"Q", "A"}


def _swap_words(text: str) -> str:
    def swap(m: re.Match) -> str:
        w = m.group(0)
        alt = _SYNONYMS.get(w.lower())
        if alt is None:
            return w
        return alt[0].upper() + alt[1:] if w[0].isupper() else alt

    return re.sub(r"[A-Za-z]+", swap, text)


def rule_rephrase(text: str) -> str:
    """Deterministic rewording: known question shapes turned around, else word synonyms.

    >>> rule_rephrase("Q: Where was Ada Lum born? A:")
    'Q: Name the birth town of Ada Lum. A:'
    """
    out, hit = text, False
    for pattern, repl in _PATTERNS:
        out, n = re.subn(pattern, repl, out)
        hit = hit or n > 0
    return out if hit else _swap_words(text)


def lm_rephrase(model, tokenizer, text: str, max_new_tokens: int = 48) -> str | None:
    """The local LM's rewording of ``text``, or None when it fails the checks above."""
    out = generate_texts(model, tokenizer, [REPHRASE_PROMPT.format(text=text)],
                         max_new_tokens=max_new_tokens, stop=("\n",))[0].strip()
    if not out or out == text.strip() or not _names(text) <= _names(" " + out):
        return None
    return out


def rephrase(text: str, model=None, tokenizer=None) -> tuple[str, str]:
    """``(rephrased, how)``: by the local LM when given and accepted (``how="lm"``), else by
    :func:`rule_rephrase` (``how="rules"``)."""
    if model is not None and tokenizer is not None:
        out = lm_rephrase(model, tokenizer, text)
        if out is not None:
            return out, "lm"
    return rule_rephrase(text), "rules"
