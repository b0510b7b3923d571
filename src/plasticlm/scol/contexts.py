"""Streams of contexts for SCoL: SQuAD-format passages and chunked long documents (the
records themselves, :class:`Context` and :class:`Question`, live in ``scol.records``)."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

from plasticlm.errors import PlasticError
from plasticlm.scol.records import Context, Question


def contexts_from_passages(passages, legal: Callable[[str], tuple[str, ...]] | None = None,
                           swap: Callable[[str, str, str], str] | None = None) -> list[Context]:
    """SQuAD passages (``plasticlm.data.records.Passage``) as contexts with their questions;
    ``legal(question_id)`` gives a question's closed set of legal answers (empty: open) and
    ``swap(question_id, question, title)`` the same question about an unseen entity."""
    return [Context(p.title or f"passage-{i}", p.context,
                    tuple(Question(q.question, tuple(a.text for a in q.answers),
                                   legal(q.id) if legal else (),
                                   swap(q.id, q.question, p.title) if swap else "")
                          for q in p.qas))
            for i, p in enumerate(passages)]


def split_streams(contexts: Sequence[Context], train_streams: int, stream_length: int,
                  eval_length: int, seed: int = 0) -> tuple[list[list[Context]], list[Context]]:
    """Disjoint meta-training streams and one evaluation stream, drawn without replacement.

    Evaluation contexts never appear in training, so a policy cannot have been rewarded on
    the questions it is later graded on.
    """
    need = train_streams * stream_length + eval_length
    if need > len(contexts):
        raise PlasticError(f"{train_streams} training streams of {stream_length} and an "
                           f"evaluation stream of {eval_length} need {need} contexts; only "
                           f"{len(contexts)} are available (use fewer or shorter streams)")
    pool = list(contexts)
    random.Random(seed).shuffle(pool)
    evaluation = pool[:eval_length]
    rest = pool[eval_length:]
    train = [rest[i * stream_length: (i + 1) * stream_length] for i in range(train_streams)]
    return train, evaluation


def chunk_text(tokenizer, text: str, window: int, prefix: str = "") -> list[Context]:
    """``text`` cut into consecutive contexts of at most ``window`` tokens each."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if window < 8:
        raise PlasticError(f"chunk window must be at least 8 tokens, not {window}")
    return [Context(f"{prefix}chunk-{i // window}", tokenizer.decode(ids[i: i + window]))
            for i in range(0, len(ids), window)]


def evidence_chunks(chunks: Sequence[Context], question: str, answer: str) -> list[int]:
    """Indices of the chunks that state ``answer`` next to the question's names
    (capitalised words past the first); when no chunk has both, those with the answer; when
    no chunk has it whole, the pairs of neighbours that a chunk boundary cuts it between."""
    names = re.findall(r"\b[A-Z][\w'-]*", question)[1:]
    text, want = [c.text.lower() for c in chunks], answer.lower()
    has_answer = [i for i, t in enumerate(text) if want in t]
    both = [i for i in has_answer if any(n in chunks[i].text for n in names)]
    if has_answer:
        return both or has_answer
    cut = [i for i in range(len(text) - 1)
           if want in text[i] + text[i + 1] or want in f"{text[i]} {text[i + 1]}"]
    return sorted({j for i in cut for j in (i, i + 1)})


def evidence_window(chunks: Sequence[Context], question: str, answer: str, length: int
                    ) -> tuple[list[Context], bool]:
    """``length`` consecutive chunks (the regime's stream length) that contain the
    evidence, placed as early as the document allows so that the rest of the stream comes
    after it; ``(window, found)``. Without located evidence: the last ``length`` chunks and
    False."""
    if length < 1:
        raise PlasticError(f"a stream needs at least one chunk, not {length}")
    found = evidence_chunks(chunks, question, answer)
    if not found:
        return list(chunks[-length:]), False
    start = max(0, min(found[0], len(chunks) - length))
    window = list(chunks[start: start + length])
    assert any(chunks[i] in window for i in found), "the evidence chunk left the window"
    return window, True
