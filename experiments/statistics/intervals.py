"""Confidence intervals and tests used by experiments.statistics.aggregate and experiments.statistics.compare
(scipy underneath).

    quantile_interval(values, q, level)        distribution-free interval of the q-th percentile of the
                                               distribution a sample was drawn from (fractional order
                                               statistics, below); NaN when n is too small for the level
    quantile_min_n(q, level)                   the fewest samples that give such an interval
    t_interval(values, level)                  Student t interval of a mean from independent repeats
    bootstrap_interval(samples, stat, level)   percentile bootstrap (Efron & Tibshirani 1993, ch. 13)
    holm(p_values, alpha)                      Holm's step-down adjusted p-values (Holm 1979)
    t_test(diffs) / welch_test(a, b)           two-sided p-value and standard error of a paired / unpaired
                                               difference of means
    detectable_effect(se, df, alpha, power)    the smallest true difference a two-sided t test at alpha
                                               detects with the given power (noncentral t)
    power_at(delta, se, df, alpha)             the chance that test detects a true difference delta
    pairs_needed(sd, delta, alpha, power)      the fewest pairs for that power, from one pair's sd

Quantile intervals. For n independent draws from a continuous distribution, the r-th order statistic
U_(r) of the uniform case is Beta(r, n + 1 - r), so P(X_(r) <= xi_q) = P(Binomial(n, q) >= r) whatever the
distribution: the classical distribution-free interval [X_(l), X_(u)] (Hahn & Meeker, Statistical
Intervals, 1991, sec. 5.2). With integer ranks its coverage jumps between values (at n = 40 the p90
interval covers 94.3% or 97.0%, nothing between), so we use Hutson's fractional order statistics
(Hutson 1999, J. Applied Statistics 26(3)): real ranks l, u solving I_q(l, n + 1 - l) = 1 - a/2 and
I_q(u, n + 1 - u) = a/2 (I: the regularized incomplete beta, i.e. the binomial tail), each end
interpolated linearly between the two order statistics around its rank. Coverage is exact for uniform
data and within the neighbouring integer-rank coverages otherwise (error O(1/n), Goldman & Kaplan 2017,
J. Econometrics 196(2)); tests/runner/test_stats.py measures it on normal, lognormal and Pareto data.
When l < 1 or u > n is needed (e.g. p99 from fewer than 367 requests at 95%: even the sample maximum
lies below the true p99 with probability 0.99^n > 2.5%) there is no interval at that level.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

DEFAULT_RESAMPLES = 2000


# ---- quantiles within one sample --------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def quantile_ranks(n: int, q: float, level: float = 0.95) -> tuple[float, float] | None:
    """Fractional 1-based ranks (l, u) of the level interval of the q-th percentile (q in (0, 100)) from
    n draws; None when n is too small for an interval at that level."""
    from scipy import optimize, special

    p, tail = q / 100.0, (1.0 - level) / 2.0
    if n < 2 or not 0.0 < p < 1.0:
        return None

    def below(r: float) -> float:  # P(U_(r) <= p), decreasing in r
        return float(special.betainc(r, n + 1.0 - r, p))

    if below(1.0) < 1.0 - tail or below(float(n)) > tail:
        return None
    lo = optimize.brentq(lambda r: below(r) - (1.0 - tail), 1.0, float(n), xtol=1e-10)
    hi = optimize.brentq(lambda r: below(r) - tail, 1.0, float(n), xtol=1e-10)
    return lo, hi


def quantile_min_n(q: float, level: float = 0.95) -> int:
    """The fewest draws that give a level interval of the q-th percentile: the sample minimum must lie
    above, and the maximum below, the true percentile with probability at most (1 - level) / 2 each."""
    p, tail = q / 100.0, (1.0 - level) / 2.0
    n = max(2, math.ceil(max(math.log(tail) / math.log(p), math.log(tail) / math.log(1.0 - p)) - 1e-9))
    while quantile_ranks(n, q, level) is None:  # guards the rounding of the closed form
        n += 1
    return n


def _at_rank(ordered: np.ndarray, rank: float) -> np.ndarray:
    """The fractional order statistic at a 1-based real rank, along the last axis of sorted data."""
    k = min(int(math.floor(rank)), ordered.shape[-1] - 1)
    frac = rank - k
    return (1.0 - frac) * ordered[..., k - 1] + frac * ordered[..., k]


def quantile_interval(values, q: float, level: float = 0.95) -> tuple:
    """(low, high) of the q-th percentile, along the last axis of values (one sample per row); (nan, nan)
    when the sample is too small (quantile_min_n). NaNs are dropped from a 1-D sample."""
    v = np.asarray(values, dtype=float)
    if v.ndim == 1:
        v = v[np.isfinite(v)]
    ranks = quantile_ranks(int(v.shape[-1]), float(q), float(level))
    if ranks is None:
        nan = np.full(v.shape[:-1], math.nan)
        return (math.nan, math.nan) if v.ndim == 1 else (nan, nan.copy())
    ordered = np.sort(v, axis=-1)
    lo, hi = _at_rank(ordered, ranks[0]), _at_rank(ordered, ranks[1])
    return (float(lo), float(hi)) if v.ndim == 1 else (lo, hi)


# ---- means over repeats -----------------------------------------------------------------------------
def t_interval(values: npt.ArrayLike, level: float = 0.95) -> tuple[float, float]:
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


def ci95(values) -> tuple[float, float]:
    """(mean, half-width of the 95% t interval) of the finite values, None and NaN left out; the
    half-width is NaN for a single value, both NaN for none."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan
    low, high = t_interval(v)
    return float(v.mean()), (high - low) / 2


def t_test(diffs: Sequence[float]) -> tuple[float, float, int]:
    """(p, standard error, degrees of freedom) of the mean of paired differences (two-sided, H0: 0)."""
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    d = d[np.isfinite(d)]
    if d.size < 2:
        return math.nan, math.nan, 0
    se = float(d.std(ddof=1) / math.sqrt(d.size))
    mean = float(d.mean())
    if se == 0:
        return (1.0 if mean == 0 else 0.0), 0.0, d.size - 1
    return float(2 * stats.t.sf(abs(mean) / se, d.size - 1)), se, d.size - 1


def welch_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(p, standard error, Welch-Satterthwaite df) of mean(a) - mean(b) from independent samples."""
    from scipy import stats

    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.size < 2 or xb.size < 2:
        return math.nan, math.nan, 0.0
    va, vb = xa.var(ddof=1) / xa.size, xb.var(ddof=1) / xb.size
    se = math.sqrt(va + vb)
    diff = float(xa.mean() - xb.mean())
    if se == 0:
        return (1.0 if diff == 0 else 0.0), 0.0, float(xa.size + xb.size - 2)
    df = (va + vb) ** 2 / (va**2 / (xa.size - 1) + vb**2 / (xb.size - 1))
    return float(2 * stats.t.sf(abs(diff) / se, df)), se, float(df)


def holm(p_values: Sequence[float], alpha: float = 0.05) -> np.ndarray:
    """Holm-adjusted p-values (NaN stays NaN and does not count): reject where adjusted <= alpha. Controls
    the family-wise error like Bonferroni and rejects at least as much (Holm 1979)."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, math.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = idx.size
    order = idx[np.argsort(p[idx], kind="stable")]
    running = 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[j]))
        out[j] = running
    return out


def power_at(delta: float, se: float, df: float, alpha: float = 0.05) -> float:
    """The probability that a two-sided t test at alpha, with this standard error and df, rejects "no
    difference" when the true difference is delta (noncentral t; Cohen 1988 ch. 2). NaN without noise."""
    from scipy import stats

    if not (math.isfinite(se) and se > 0 and df > 0):
        return math.nan
    nc = abs(delta) / se
    if math.isinf(df):  # a normal statistic (e.g. a bootstrap's)
        z = float(stats.norm.ppf(1 - alpha / 2))
        return float(stats.norm.sf(z - nc) + stats.norm.cdf(-z - nc))
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    value = float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))
    return 1.0 if math.isnan(value) else value  # scipy's nct gives NaN far in the tail


def detectable_effect(se: float, df: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The true difference a two-sided t test at alpha, with this standard error and df, detects with the
    given power (noncentral t; Cohen 1988 ch. 2). NaN without an estimate of the noise."""
    from scipy import optimize, stats

    if not (math.isfinite(se) and df > 0):
        return math.nan
    if se == 0:
        return 0.0
    if math.isinf(df):  # a normal statistic (e.g. a bootstrap's)
        return se * float(stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power))

    def short(delta: float) -> float:
        return power_at(delta, se, df, alpha) - power

    high = se * float(stats.t.ppf(1 - alpha / 2, df))
    while short(high) < 0:
        high *= 2
    return float(optimize.brentq(short, 0.0, high, xtol=se * 1e-6))


def pairs_needed(sd: float, delta: float, alpha: float = 0.05, power: float = 0.8, most: int = 10_000) -> int:
    """The fewest pairs whose paired t test at alpha detects a true difference delta with the given power,
    when one pair's difference has standard deviation sd (sd assumed known: a planning figure)."""
    for n in range(2, most + 1):
        if power_at(delta, sd / math.sqrt(n), n - 1, alpha) >= power:
            return n
    raise ValueError(f"more than {most} pairs needed for {delta} at sd {sd}")


# ---- bootstrap --------------------------------------------------------------------------------------
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
    lo, hi, _ = bootstrap(samples, statistic, level, n_resamples, seed, paired)
    return lo, hi


def bootstrap(
    samples: Sequence[Sequence[float]],
    statistic: Callable,
    level: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    paired: bool = False,
) -> tuple[float, float, np.ndarray]:
    """bootstrap_interval's (low, high) and the resampled statistics (empty when degenerate)."""
    from scipy import stats

    data = tuple(np.asarray(s, dtype=float) for s in samples)
    if not data or any(d.size == 0 for d in data):
        return math.nan, math.nan, np.empty(0)
    point = float(statistic(*data, axis=-1))
    if all(d.size == 1 or np.all(d == d[0]) for d in data) and not paired:
        return point, point, np.empty(0)
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
        return point, point, np.empty(0)
    return lo, hi, np.asarray(res.bootstrap_distribution, dtype=float)
