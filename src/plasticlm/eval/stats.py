"""Confidence intervals for evaluation scores: item bootstrap, cluster bootstrap, across seeds.

Which interval a table reports (one rule for every experiment table):

- A measure with one score per item (accuracy, EM, F1, per-item loss) is reported as
  :func:`pooled_bootstrap_ci` over the items of all seeds (each table runs >= 3 seeds), paired
  against the baseline on the same items when the cell is a difference, and clustered with
  ``groups`` (entity ids) where several items ask about one entity. It measures how much the
  number would move with other items drawn from the same world, given the trained models.
- A measure with only one number per run (a loss over a stream, wall time, a learned value)
  is reported as :func:`seed_ci`, the t-interval over the seeds' values. It also covers the
  retraining noise that the item bootstrap does not, at the price of width with few seeds;
  print it beside the pooled interval when a claim is about training runs, not items.
- A difference between two training recipes (a method minus its control) gets both: the
  paired pooled interval and :func:`paired_seed_ci`, the t-interval of the seeds' paired
  differences (rendered together by :func:`format_paired`); :func:`verdict` with
  ``over_seeds`` calls it better or worse only when both exclude zero.

Percentile bootstrap: Efron & Tibshirani, "An Introduction to the Bootstrap" (1993); the
cluster variant resamples whole groups (Davison & Hinkley, "Bootstrap Methods and their
Application" (1997), on hierarchical data).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Sequence
from dataclasses import asdict

import numpy as np

from plasticlm.eval.ci import CI

_MAX_DRAWS = 1 << 22  # index draws held in memory at once by the bootstrap


def _as_scores(values, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of numbers, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: an interval needs at least one score")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} holds NaN or infinite values; drop or fix them first")
    return arr


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), not {level}")


def bootstrap_ci(scores: Sequence[float], baseline: Sequence[float] | None = None,
                 level: float = 0.95, n_boot: int = 2000, seed: int = 0,
                 groups: Sequence[Hashable] | None = None) -> CI:
    """Percentile-bootstrap interval of the mean of ``scores`` [n].

    With ``baseline`` [n] (the same items scored by the other system) the interval is of the
    mean difference ``scores - baseline``. With ``groups`` [n] (one label per item, e.g. an
    entity id) whole groups are resampled, so items sharing a label move together.
    Deterministic given ``seed``.
    """
    x = _as_scores(scores, "scores")
    if baseline is not None:
        b = _as_scores(baseline, "baseline")
        if len(b) != len(x):
            raise ValueError(f"paired bootstrap needs one baseline score per item: {len(x)} "
                             f"scores but {len(b)} baseline scores")
        x = x - b
    _check_level(level)
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, not {n_boot}")
    if groups is None:
        sums, counts = x, np.ones_like(x)
    else:
        labels = list(groups)
        if len(labels) != len(x):
            raise ValueError(f"groups needs one label per item: {len(x)} scores but "
                             f"{len(labels)} labels")
        codes: dict[Hashable, int] = {}
        idx = np.fromiter((codes.setdefault(g, len(codes)) for g in labels), np.int64, len(x))
        sums = np.bincount(idx, weights=x)
        counts = np.bincount(idx).astype(np.float64)
    mean = float(x.mean())
    units = len(sums)
    if units == 1:
        return CI(mean, mean, mean, len(x), level, degenerate=True)
    rng = np.random.default_rng(seed)
    rows = max(1, _MAX_DRAWS // units)
    means = np.empty(n_boot)
    for start in range(0, n_boot, rows):
        stop = min(n_boot, start + rows)
        pick = rng.integers(0, units, size=(stop - start, units))
        if groups is None:
            means[start:stop] = sums[pick].mean(axis=1)
        else:
            means[start:stop] = sums[pick].sum(axis=1) / counts[pick].sum(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return CI(mean, float(low), float(high), len(x), level)


def pooled_bootstrap_ci(per_seed_scores: Sequence[Sequence[float]],
                        baseline_per_seed: Sequence[Sequence[float]] | None = None,
                        level: float = 0.95, n_boot: int = 2000, seed: int = 0,
                        groups_per_seed: Sequence[Sequence[Hashable]] | None = None) -> CI:
    """:func:`bootstrap_ci` over the items of all seeds concatenated ([seeds][items]).

    ``baseline_per_seed[s]`` pairs with ``per_seed_scores[s]`` by position. Group labels are
    pooled as given: the same label under two seeds is one cluster; label with
    ``(seed, entity)`` to keep seeds' entities apart.
    """
    if len(per_seed_scores) == 0:
        raise ValueError("per_seed_scores is empty: give each seed's item scores")
    scores = [list(s) for s in per_seed_scores]
    baseline = None
    if baseline_per_seed is not None:
        if len(baseline_per_seed) != len(scores):
            raise ValueError(f"{len(scores)} seeds of scores but {len(baseline_per_seed)} of "
                             "baseline scores")
        baseline = []
        for s, (mine, theirs) in enumerate(zip(scores, baseline_per_seed)):
            if len(theirs) != len(mine):
                raise ValueError(f"seed {s}: {len(mine)} scores but {len(theirs)} baseline "
                                 "scores; pairs are matched by position")
            baseline.extend(theirs)
    groups = None
    if groups_per_seed is not None:
        if len(groups_per_seed) != len(scores) or any(
                len(g) != len(s) for g, s in zip(groups_per_seed, scores)):
            raise ValueError("groups_per_seed needs one label per item of every seed")
        groups = [g for labels in groups_per_seed for g in labels]
    flat = [v for s in scores for v in s]
    return bootstrap_ci(flat, baseline, level, n_boot, seed, groups)


def t_critical(level: float, df: int) -> float:
    """Two-sided Student-t critical value: ``P(|T_df| <= t) = level``.

    Exact finite series of the t distribution for integer ``df`` (Abramowitz & Stegun
    26.7.3-4) inverted by bisection; a Cornish-Fisher expansion for very large ``df``.
    """
    _check_level(level)
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, not {df}")
    if df > 1000:
        z = statistics.NormalDist().inv_cdf((1 + level) / 2)
        return (z + (z**3 + z) / (4 * df)
                + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2))
    lo, hi = 0.0, math.pi / 2
    for _ in range(80):  # bisect on theta = atan(t / sqrt(df)), where P(|T| <= t) rises
        mid = (lo + hi) / 2
        if _t_central_mass(mid, df) < level:
            lo = mid
        else:
            hi = mid
    return math.sqrt(df) * math.tan((lo + hi) / 2)


def _t_central_mass(theta: float, df: int) -> float:
    """``P(|T_df| <= sqrt(df) tan(theta))``."""
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:
        term, total = c, 0.0
        for k in range(1, (df - 1) // 2 + 1):  # c + 2/3 c^3 + (2*4)/(3*5) c^5 + ...
            total += term
            term *= (2 * k) / (2 * k + 1) * c * c
        return 2 / math.pi * (theta + s * total) if df > 1 else 2 * theta / math.pi
    term, total = 1.0, 0.0
    for k in range(1, df // 2 + 1):  # 1 + 1/2 c^2 + (1*3)/(2*4) c^4 + ...
        total += term
        term *= (2 * k - 1) / (2 * k) * c * c
    return s * total


def _seed_scores(value, name: str) -> np.ndarray:
    """One seed's value or item scores as a 1-d array."""
    return _as_scores(np.atleast_1d(np.asarray(value, dtype=np.float64)), name)


def seed_ci(values_per_seed: Sequence[float | Sequence[float]], level: float = 0.95) -> CI:
    """Mean over seeds and its t-interval ``mean +- t * sd / sqrt(seeds)``.

    Each entry is one seed's value or its item scores (reduced to their mean). One seed gives
    a degenerate interval (``low == high == mean``, ``degenerate`` set).
    """
    if len(values_per_seed) == 0:
        raise ValueError("values_per_seed is empty: give one value (or item scores) per seed")
    _check_level(level)
    m = _as_scores([_seed_scores(v, f"seed {s}'s values").mean()
                    for s, v in enumerate(values_per_seed)], "seed means")
    mean, k = float(m.mean()), len(m)
    if k == 1:
        return CI(mean, mean, mean, 1, level, degenerate=True)
    half = t_critical(level, k - 1) * float(m.std(ddof=1)) / math.sqrt(k)
    return CI(mean, mean - half, mean + half, k, level)


def paired_seed_ci(per_seed_scores: Sequence[float | Sequence[float]],
                   baseline_per_seed: Sequence[float | Sequence[float]],
                   level: float = 0.95) -> CI:
    """t-interval over seeds of the paired difference ``mean(scores[s]) - mean(baseline[s])``.

    The seed-level companion of a paired :func:`pooled_bootstrap_ci`: seed ``s`` of
    ``per_seed_scores`` and of ``baseline_per_seed`` are one training seed under two recipes
    (a value each, or item scores paired by position), so retraining noise shared by a seed
    cancels and what is left is the recipe's effect from seed to seed. This is the interval
    for a claim about a training recipe; the pooled one speaks for the items.
    """
    if len(per_seed_scores) != len(baseline_per_seed):
        raise ValueError(f"{len(per_seed_scores)} seeds of scores but {len(baseline_per_seed)} "
                         "of baseline scores; seeds pair by position")
    diffs = []
    for s, (mine, theirs) in enumerate(zip(per_seed_scores, baseline_per_seed)):
        a = _seed_scores(mine, f"seed {s}'s scores")
        b = _seed_scores(theirs, f"seed {s}'s baseline scores")
        if len(a) != len(b):
            raise ValueError(f"seed {s}: {len(a)} scores but {len(b)} baseline scores; items "
                             "pair by position")
        diffs.append(float((a - b).mean()))
    return seed_ci(diffs, level)


def paired_intervals(per_seed_scores: Sequence[Sequence[float]],
                     baseline_per_seed: Sequence[Sequence[float]],
                     groups_per_seed: Sequence[Sequence[Hashable]] | None = None
                     ) -> tuple[CI, CI]:
    """A recipe comparison ([seeds][items], paired by position): the paired
    :func:`pooled_bootstrap_ci` over the items of all seeds, and the :func:`paired_seed_ci`
    of the same pairs; render with :func:`format_paired`, judge with :func:`verdict`."""
    return (pooled_bootstrap_ci(per_seed_scores, baseline_per_seed,
                                groups_per_seed=groups_per_seed),
            paired_seed_ci(per_seed_scores, baseline_per_seed))


def paired_summary(key: str, per_seed_scores: Sequence[Sequence[float]],
                   baseline_per_seed: Sequence[Sequence[float]],
                   groups_per_seed: Sequence[Sequence[Hashable]] | None = None) -> dict:
    """:func:`paired_intervals` as JSON-ready entries: ``key`` the pooled interval and
    ``key + "_over_seeds"`` the seeds' one. Read back with :func:`format_summary`."""
    pooled, over_seeds = paired_intervals(per_seed_scores, baseline_per_seed, groups_per_seed)
    return {key: asdict(pooled), f"{key}_over_seeds": asdict(over_seeds)}
