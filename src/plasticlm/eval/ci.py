"""The confidence interval every table reports (:class:`CI`), how it renders
(``format_ci``, ``format_paired``, ``format_summary``) and when a difference counts
(``verdict``); the estimators that make one are in :mod:`plasticlm.eval.stats`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["better", "worse", "no difference"]


@dataclass(frozen=True)
class CI:
    """A mean and its ``level`` interval ``[low, high]`` from ``n`` units (items or seeds).

    ``degenerate`` marks an interval that could not be estimated (one unit: one seed, one
    item or one group); then ``low == high == mean`` and it renders as "x.x [n=1]".
    """

    mean: float
    low: float
    high: float
    n: int
    level: float
    degenerate: bool = False

    def __post_init__(self):
        if not 0 < self.level < 1:
            raise ValueError(f"level must be in (0, 1), not {self.level}")
        if self.n < 1:
            raise ValueError(f"an interval needs n >= 1 units, not {self.n}")
        if not self.low <= self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")

    @property
    def width(self) -> float:
        return self.high - self.low

    @property
    def excludes_zero(self) -> bool:
        """Whether zero lies outside the interval (for a difference: a significant one)."""
        return self.low > 0 or self.high < 0

    @property
    def significant(self) -> bool:
        """Alias of :attr:`excludes_zero`, for intervals of differences."""
        return self.excludes_zero

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def format(self, scale: float = 100, digits: int = 1) -> str:
        """``"mean [low, high]"`` with every number times ``scale`` to ``digits`` decimals."""
        mean = _fmt(self.mean * scale, digits)
        if self.degenerate:
            return f"{mean} [n=1]"
        return f"{mean} [{_fmt(self.low * scale, digits)}, {_fmt(self.high * scale, digits)}]"

    def __str__(self) -> str:
        return self.format()


def _fmt(value: float, digits: int) -> str:
    return f"{round(value, digits) + 0.0:.{digits}f}"  # + 0.0 turns -0.0 into 0.0


def format_ci(ci: CI, scale: float = 100, digits: int = 1) -> str:
    """``ci`` as ``"x.x [lo, hi]"``; the one rendering every table uses."""
    return ci.format(scale, digits)


def verdict(ci_of_difference: CI, higher_is_better: bool = True,
            over_seeds: CI | None = None) -> Verdict:
    """"better"/"worse" when the interval of a difference excludes zero, else "no difference".

    With ``over_seeds`` (the :func:`paired_seed_ci` of the same difference), a claim about a
    training recipe: "better"/"worse" only when both intervals exclude zero on the same side;
    a single seed's degenerate interval is not evidence either way and is ignored.
    """
    intervals = [ci_of_difference]
    if over_seeds is not None and not over_seeds.degenerate:
        intervals.append(over_seeds)
    if not all(c.excludes_zero for c in intervals):
        return "no difference"
    sides = {c.low > 0 for c in intervals}
    if len(sides) > 1:
        return "no difference"
    return "better" if sides.pop() == higher_is_better else "worse"


def format_paired(pooled: CI, over_seeds: CI, scale: float = 100, digits: int = 1) -> str:
    """A paired difference as ``"x.x [lo, hi] (seeds [lo, hi])"``: the item interval pooled
    over seeds, then the t-interval of the seeds' differences (:func:`paired_seed_ci`)."""
    if over_seeds.degenerate:
        return f"{pooled.format(scale, digits)} (seeds: n/a, one seed)"
    return (f"{pooled.format(scale, digits)} (seeds [{_fmt(over_seeds.low * scale, digits)}, "
            f"{_fmt(over_seeds.high * scale, digits)}])")


def format_summary(entry: Mapping, key: str, scale: float = 100, digits: int = 1) -> str:
    """``entry[key]`` rendered: with its ``_over_seeds`` interval by :func:`format_paired`,
    alone (summaries written before it existed) by :func:`format_ci`; "-" when absent."""
    if key not in entry:
        return "-"
    pooled = CI(**entry[key])
    over = entry.get(f"{key}_over_seeds")
    return (format_paired(pooled, CI(**over), scale, digits) if over
            else format_ci(pooled, scale, digits))
