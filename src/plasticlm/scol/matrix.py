"""The lower-triangular accuracy matrix of a consolidated stream (row r: closed-book accuracy
on contexts 0..r after r+1 commits, as SEAL reports it), with its controls: the share of
legal answers, the entity-swapped questions, and closed-set multiple choice (the attribute's
legal values ranked by log-likelihood), which sees a fact the greedy answer does not yet
produce."""

from __future__ import annotations

from collections.abc import Sequence

from plasticlm.eval import closed_set_accuracy, is_legal, normalize_answer, squad_score
from plasticlm.scol.records import Context, Question
from plasticlm.scol.rewards import qa_answers, qa_prompt


class AccuracyMatrix:
    """Lower-triangular closed-book QA scores: ``em[r][i]``, ``f1[r][i]`` for i <= r.

    A row may be partial (:meth:`add_row` with ``full=False``): only its newest context is
    asked and the earlier entries are None. Long streams ask every row's newest context (the
    immediate accuracy) but the earlier ones only in some rows: the cost of a full matrix
    grows with the square of the stream's length.
    """

    def __init__(self, contexts: Sequence[Context]):
        self.contexts = list(contexts)
        self.em: list[list[float]] = []
        self.f1: list[list[float]] = []
        self.legal: list[float | None] = []   # per row: share of closed-set answers legal
        # the entity-swap control: EM of the same questions about an unseen entity, for the
        # row's newest context (immediate) and, in the stream's last row, every context
        self.swap_diag: list[float] = []
        self.swap_last: list[float] = []
        # closed-set MC on the same rows (newest context; last row: every context), its chance
        self.mc_diag: list[float] = []
        self.mc_last: list[float] = []
        self.mc_chance: float | None = None

    def add_row(self, model, tokenizer, upto: int, prefix: str = "", full: bool = True) -> None:
        """Row ``upto`` (after ``upto + 1`` commits): every context 0..upto, or with ``full``
        False its newest context alone. The stream's last row is always full."""
        full = full or upto == len(self.contexts) - 1
        qs, owner = [], []
        for i, c in enumerate(self.contexts[: upto + 1]):
            if full or i == upto:
                qs += c.questions
                owner += [i] * len(c.questions)
        preds = qa_answers(model, tokenizer, qs, prefix)
        scores = [squad_score(p, list(q.answers)) for p, q in zip(preds, qs)]
        closed = [(p, q.legal) for p, q in zip(preds, qs) if q.legal]
        # a partial row's few answers are another population: no legal rate for it
        self.legal.append(sum(is_legal(p, v) for p, v in closed) / len(closed)
                          if closed and full else None)
        last = upto == len(self.contexts) - 1
        swapped = [(i, q) for i, q in zip(owner, qs) if q.swapped and (last or i == upto)]
        if swapped:
            swap_preds = qa_answers(model, tokenizer, [Question(q.swapped, q.answers)
                                                       for _, q in swapped], prefix)
            em = [(i, squad_score(p, list(q.answers))[0])
                  for (i, q), p in zip(swapped, swap_preds)]

            def mean_of(j: int) -> float:
                xs = [e for i, e in em if i == j]
                return sum(xs) / max(1, len(xs))
            self.swap_diag.append(mean_of(upto))
            if last:
                self.swap_last = [mean_of(j) for j in range(upto + 1)]
        self._closed_set(model, tokenizer, upto, owner, qs, last, prefix)
        em_row: list[float | None] = [None] * upto if not full else []
        f1_row: list[float | None] = [None] * upto if not full else []
        for i in range(0 if full else upto, upto + 1):
            mine = [s for s, o in zip(scores, owner) if o == i]
            em_row.append(sum(s[0] for s in mine) / max(1, len(mine)))
            f1_row.append(sum(s[1] for s in mine) / max(1, len(mine)))
        self.em.append(em_row)
        self.f1.append(f1_row)

    def _closed_set(self, model, tokenizer, upto: int, owner: list[int],
                    qs: list[Question], last: bool, prefix: str) -> None:
        items = [(i, q) for i, q in zip(owner, qs)
                 if q.legal and (last or i == upto)
                 and normalize_answer(q.answers[0]) in {normalize_answer(v) for v in q.legal}]
        if not items:
            return
        res = closed_set_accuracy(model, tokenizer, [qa_prompt(q.question, prefix)
                                                     for _, q in items],
                                  [list(q.legal) for _, q in items],
                                  [q.answers[0] for _, q in items])

        def mean_of(j: int) -> float:
            xs = [c for (i, _), c in zip(items, res.correct) if i == j]
            return sum(xs) / max(1, len(xs))
        self.mc_diag.append(mean_of(upto))
        if last:
            self.mc_last = [mean_of(j) for j in range(upto + 1)]
            self.mc_chance = res.chance_accuracy

    def full_rows(self) -> list[int]:
        """The indices of the rows asked about every context."""
        return [r for r, row in enumerate(self.em) if None not in row]

    def summary(self) -> dict:
        def mean(xs) -> float | None:
            return sum(xs) / len(xs) if xs else None

        def stats(m: list[list[float]]) -> dict:
            diag = [row[i] for i, row in enumerate(m) if i < len(row)]
            last = m[-1] if m else []
            return {"immediate": sum(diag) / len(diag) if diag else None,
                    "retention": (sum(last[:-1]) / (len(last) - 1)) if len(last) > 1 else None,
                    "final_all": sum(last) / len(last) if last else None}
        mc = {"immediate": mean(self.mc_diag), "retention": mean(self.mc_last[:-1]),
              "final_all": mean(self.mc_last)}
        return {"em": stats(self.em), "f1": stats(self.f1), "mc": mc, "matrix_em": self.em,
                "matrix_f1": self.f1, "legal": self.legal,
                "legal_final": self.legal[-1] if self.legal else None,
                "swap_diag": self.swap_diag, "swap_last": self.swap_last,
                "mc_diag": self.mc_diag, "mc_last": self.mc_last, "mc_chance": self.mc_chance}
