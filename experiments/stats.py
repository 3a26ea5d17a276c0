"""Confidence intervals used by experiments.aggregate and experiments.compare (scipy underneath).

    t_interval(values, level)                  Student t interval of a mean from independent repeats
    bootstrap_interval(samples, stat, level)   percentile bootstrap; several samples are resampled each on
                                               its own (strata, e.g. one per repeat) and the statistic sees
                                               them all; paired=True resamples aligned rows together
    percentile_of_strata(q)                    the statistic "mean over strata of each stratum's q-th
                                               percentile" (numpy's linear interpolation, as vLLM's)

Percentile bootstrap (Efron & Tibshirani 1993, ch. 13): simple and transformation-respecting; for tail
percentiles it needs enough samples beyond the percentile (tests/runner/test_stats.py measures its
coverage on a known distribution).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

DEFAULT_RESAMPLES = 2000


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """(low, high) of the mean of independent values; (nan, nan) with fewer than two."""
    from scipy import stats

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size < 2:
        return math.nan, math.nan
    mean, sem = float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.size))
    if sem == 0:
        return mean, mean
    half = float(stats.t.ppf(0.5 + level / 2, v.size - 1)) * sem
    return mean - half, mean + half


def percentile_of_strata(q: float) -> Callable:
    """Vectorised statistic for bootstrap_interval: mean over the samples of each one's q-th percentile."""

    def statistic(*samples, axis=-1):
        return np.mean([np.percentile(s, q, axis=axis) for s in samples], axis=0)

    return statistic


def mean_of_strata(*samples, axis=-1):
    return np.mean([np.mean(s, axis=axis) for s in samples], axis=0)


def bootstrap_interval(
    samples: Sequence[Sequence[float]],
    statistic: Callable,
    level: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    paired: bool = False,
) -> tuple[float, float]:
    """Percentile-bootstrap (low, high) of statistic(*samples); (nan, nan) if a sample is empty.
    A statistic constant under resampling (e.g. identical pairs) gives its value as both ends."""
    from scipy import stats

    data = tuple(np.asarray(s, dtype=float) for s in samples)
    if not data or any(d.size == 0 for d in data):
        return math.nan, math.nan
    point = float(statistic(*data, axis=-1))
    if all(d.size == 1 or np.all(d == d[0]) for d in data) and not paired:
        return point, point
    res = stats.bootstrap(
        data,
        statistic,
        n_resamples=n_resamples,
        confidence_level=level,
        method="percentile",
        paired=paired,
        vectorized=True,
        batch=max(1, min(n_resamples, 4_000_000 // sum(d.size for d in data))),  # bounded memory
        random_state=np.random.default_rng(seed),
    )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):  # degenerate resampling distribution
        return point, point
    return lo, hi
