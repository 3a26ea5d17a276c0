"""The confidence intervals cover the true value at about their stated rate (known distributions, seeded)."""

import math

import numpy as np
import pytest
from scipy import stats

from experiments.statistics.intervals import (
    bootstrap_interval,
    detectable_effect,
    holm,
    mean_of_strata,
    pairs_needed,
    power_at,
    quantile_interval,
    quantile_min_n,
    t_interval,
    t_test,
    welch_test,
)

# distributions with known quantiles: light tail, a TTFT-like skew, a heavy (infinite-variance) tail
DISTRIBUTIONS = {
    "normal": (lambda rng, size: rng.normal(10.0, 2.0, size), lambda p: 10.0 + 2.0 * stats.norm.ppf(p)),
    "lognormal": (lambda rng, size: rng.lognormal(0.0, 1.0, size), lambda p: math.exp(stats.norm.ppf(p))),
    "pareto": (lambda rng, size: rng.pareto(1.5, size) + 1.0, lambda p: (1.0 - p) ** (-1 / 1.5)),
}
SIZES = (40, 200, 1000)
QUANTILES = (50, 90, 99)


def quantile_coverage(trials: int, seed: int = 2024) -> dict:
    """{(distribution, n, q): coverage, or None where no interval is given}, all samples drawn at once."""
    out = {}
    for k, (name, (draw, ppf)) in enumerate(DISTRIBUTIONS.items()):
        rng = np.random.default_rng([seed, k])
        for n in SIZES:
            x = draw(rng, (trials, n))
            for q in QUANTILES:
                lo, hi = quantile_interval(x, q, 0.95)
                if np.isnan(lo).all():
                    out[(name, n, q)] = None
                    continue
                truth = ppf(q / 100)
                out[(name, n, q)] = float(np.mean((lo <= truth) & (truth <= hi)))
    return out


def check_band(coverage: dict, low: float, high: float) -> None:
    printed = {key: c for key, c in coverage.items() if c is not None}
    bad = {key: c for key, c in printed.items() if not low <= c <= high}
    assert not bad, bad
    # exactly where the order statistics cannot reach 95%: p99 below 368 requests
    assert {key for key, c in coverage.items() if c is None} == {(d, n, 99) for d in DISTRIBUTIONS for n in (40, 200)}


def test_quantile_intervals_cover_95_percent():
    """p50 / p90 / p99 at n = 40, 200, 1000 of normal, lognormal and Pareto(1.5) data: every printed
    interval covers the true quantile in 93-97% of 4,000 samples. The SE of a rate near 95% is 0.34%, so a
    true coverage of 94.8-95.9% (what the slow test measures) lies 3 SE or more inside the band; an
    interval of another level fails it (the 90% one covers ~90%, the 99% one ~99%)."""
    check_band(quantile_coverage(4000), 0.93, 0.97)


@pytest.mark.slow
def test_quantile_intervals_cover_95_percent_thoroughly():
    """The same at 50,000 samples (SE 0.1%): within 94-96.5%."""
    check_band(quantile_coverage(50_000, seed=7), 0.94, 0.965)


def test_quantile_interval_edges():
    assert quantile_min_n(99) == 368 and quantile_min_n(90) == 36 and quantile_min_n(50) == 6
    assert all(math.isnan(v) for v in quantile_interval(np.arange(367.0), 99))
    lo, hi = quantile_interval(np.arange(368.0), 99)
    assert 350 <= lo < hi <= 367  # the upper end at (or just below) the sample maximum
    lo, hi = quantile_interval(np.arange(1.0, 101.0), 50)
    assert lo < 50.5 < hi and hi - lo < 25  # the median of 1..100 with its spread
    assert quantile_interval([3.0] * 50, 90) == (3.0, 3.0)  # ties: a degenerate interval, not an error
    assert quantile_interval([1.0, float("nan"), 2.0, 3.0, 4.0, 5.0, 6.0], 50) == quantile_interval(
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 50
    )


def test_t_interval_covers_the_mean_95_percent_of_the_time():
    """Five repeats from N(3, 2^2): the Student t interval is exact; 4,000 trials, SE of the rate ~0.34%."""
    rng = np.random.default_rng(2024)
    x = rng.normal(3.0, 2.0, (4000, 5))
    cov = np.mean([lo <= 3.0 <= hi for lo, hi in (t_interval(row) for row in x)])
    assert 0.93 <= cov <= 0.97, cov
    assert all(math.isnan(v) for v in t_interval([1.0]))  # one run: no interval


def test_paired_and_welch_tests_hold_their_level_and_find_a_shift():
    """Under no difference the two-sided p-values are uniform (rejections at 5% ~5%); a shift of 3 SE is
    found; Welch agrees with scipy's."""
    rng = np.random.default_rng(3)
    d = rng.normal(0, 1, (3000, 5))
    rejected = np.mean([t_test(row)[0] <= 0.05 for row in d])
    assert 0.035 <= rejected <= 0.065, rejected
    assert np.mean([t_test(row + 3.0)[0] <= 0.05 for row in d[:500]]) > 0.85
    a, b = rng.normal(0, 1, 6), rng.normal(1, 2, 4)
    assert welch_test(a, b)[0] == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert t_test([0.0, 0.0, 0.0]) == (1.0, 0.0, 2) and t_test([1.0, 1.0])[0] == 0.0


def test_holm_matches_its_definition():
    """Holm's adjusted p-values: sorted p times (m - rank), made monotone; NaN is not a test."""
    p = [0.01, 0.04, 0.03, 0.005, math.nan]
    adj = holm(p)
    assert adj[3] == pytest.approx(0.02) and adj[0] == pytest.approx(0.03)
    assert adj[2] == pytest.approx(0.06) and adj[1] == pytest.approx(0.06) and math.isnan(adj[4])
    assert (adj[:4] <= 0.05).sum() == 2  # Bonferroni (0.0125) would keep 2 too; Holm never fewer


def test_detectable_effect_has_the_stated_power():
    """At the reported effect, a paired t test with 5 pairs rejects in ~80% of simulated comparisons."""
    se, df, alpha = 1.0 / math.sqrt(5), 4, 0.05 / 12
    delta = detectable_effect(se, df, alpha, 0.8)
    rng = np.random.default_rng(11)
    d = rng.normal(delta, 1.0, (4000, 5))
    power = np.mean([t_test(row)[0] <= alpha for row in d])
    assert 0.77 <= power <= 0.83, (delta, power)
    assert detectable_effect(0.0, 4) == 0.0 and math.isnan(detectable_effect(math.nan, 4))


def test_power_and_pairs_needed_match_simulated_paired_tests():
    """power_at is the rejection rate of simulated paired t tests; pairs_needed is the fewest pairs at
    which that rate reaches 80% (here a difference of 0.8 sd at the full 5%)."""
    sd, delta, alpha = 1.0, 0.8, 0.05
    n = pairs_needed(sd, delta, alpha, 0.8)
    rng = np.random.default_rng(12)
    for pairs in (n - 1, n):
        expected = power_at(delta, sd / math.sqrt(pairs), pairs - 1, alpha)
        d = rng.normal(delta, sd, (4000, pairs))
        observed = np.mean([t_test(row)[0] <= alpha for row in d])
        assert abs(observed - expected) < 0.025, (pairs, observed, expected)
        assert (expected >= 0.8) == (pairs == n), (pairs, expected)
    se = sd / math.sqrt(5)
    assert power_at(detectable_effect(se, 4, alpha, 0.8), se, 4, alpha) == pytest.approx(0.8, abs=1e-4)


def test_stratified_bootstrap_of_a_mean_over_repeats():
    """Three repeats of 300 exponential samples, each resampled on its own: the interval of the mean over
    repeats covers the true mean (1.0) at about 95%."""
    rng = np.random.default_rng(2024)
    hits = 0
    for i in range(150):
        lo, hi = bootstrap_interval([rng.exponential(1.0, 300) for _ in range(3)], mean_of_strata, 0.95, 400, seed=i)
        hits += lo <= 1.0 <= hi
    assert 0.89 <= hits / 150 <= 0.99, hits / 150


def test_bootstrap_edge_cases():
    assert bootstrap_interval([[5.0, 5.0, 5.0]], mean_of_strata) == (5.0, 5.0)
    assert all(math.isnan(v) for v in bootstrap_interval([[]], mean_of_strata))
    same = np.arange(10.0)
    lo, hi = bootstrap_interval((same, same), lambda a, b, axis=-1: a.mean(axis) - b.mean(axis), paired=True)
    assert lo == hi == 0.0  # identical pairs: no difference, no width
