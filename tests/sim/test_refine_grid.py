"""Adaptive sampling of the operator microbenchmarks' linear curve (experiments/calibration/refine.py): a cliff in
time per row between two grid points is found to one row, so the interpolated curve prices both sides of it; a
straight curve costs no extra timing; one slow timing is not taken for a cliff."""

import random

from experiments.calibration.operator_bench import grids
from experiments.calibration.refine import refine
from testbed.sim.cost_models.curves import interpolate

GRID = grids(max_tokens=512, max_seqs=64, max_len=8192, quick=False)["linear"]
COARSE = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def cliff(at: int, per_row=(1e-5, 2.5e-5)):
    """A backend that switches kernels past `at` rows: 2.5x the time per row after it (as testbed's CPU linear
    at FEW_ROWS on an AMD EPYC)."""
    return lambda n: 1e-4 + n * (per_row[0] if n <= at else per_row[1])


def curve(points):
    return {"x": [x for x, _ in points], "seconds": [t for _, t in points]}


def test_a_cliff_between_grid_points_is_found_to_one_row():
    for grid in (GRID, COARSE):
        for at in (128, 200, 77, 300, 500):
            truth = cliff(at)
            points = refine(truth, grid)
            xs = [x for x, _ in points]
            assert at in xs and at + 1 in xs, (at, xs)
            for n in range(1, 513):  # every row count is now priced within 1%
                assert abs(interpolate(curve(points), n) / truth(n) - 1) < 0.01, (at, n)


def test_the_grid_alone_misprices_the_cliff():
    """What the refinement is for: without it, a grid segment is one straight line across the cliff."""
    truth = cliff(136)
    plain = curve([(n, truth(n)) for n in GRID])
    errors = [interpolate(plain, n) / truth(n) - 1 for n in (130, 136, 137, 140)]
    assert max(abs(e) for e in errors) > 0.15


def test_a_straight_or_bending_curve_costs_no_extra_timing():
    for truth in (lambda n: 2e-4 + 3e-6 * n, lambda n: 2e-4 + 1e-6 * n + 4e-9 * n * n):
        calls: list[int] = []
        points = refine(lambda n, calls=calls, truth=truth: calls.append(n) or truth(n), GRID)
        assert [x for x, _ in points] == GRID and len(calls) == len(GRID)


def test_one_slow_timing_is_timed_again_not_split():
    truth, slow = cliff(10_000), {256: 1}
    calls = []

    def measure(n):
        calls.append(n)
        factor = 1.5 if slow.get(n, 0) > 0 else 1.0
        slow[n] = slow.get(n, 0) - 1
        return truth(n) * factor

    points = dict(refine(measure, GRID))
    assert points[256] == truth(256) and calls.count(256) == 2 and len(points) == len(GRID)


def test_noise_at_few_rows_does_not_spend_the_budget_before_the_cliff():
    """The segment most out of line is split first: +-20% noise below 32 rows and a cliff at 300."""
    for seed in range(5):
        rng = random.Random(seed)
        truth = cliff(300)
        noisy = lambda n, rng=rng, truth=truth: truth(n) * (1 + rng.choice((-0.2, 0.2))) if n < 32 else truth(n)
        xs = [x for x, _ in refine(noisy, COARSE, tolerance=0.1)]
        assert 300 in xs and 301 in xs and len(xs) <= len(COARSE) + 24


def test_the_budget_bounds_the_timings():
    calls = []
    rng = random.Random(1)
    refine(lambda n: calls.append(n) or rng.uniform(1e-4, 1e-3), GRID, budget=5, retimes=3)
    assert len(calls) == len(GRID) + 5 + 3


def test_many_slow_first_timings_do_not_spend_the_splits_budget():
    """A noisy machine: every odd row count below 64 reads 1.5x slow the first time it is timed. Re-timing them has
    its own budget, furthest above the line first, so the cliff at 300 rows is still split down to one row."""
    truth, seen = cliff(300), set()

    def measure(n):
        first = n not in seen
        seen.add(n)
        return truth(n) * (1.5 if first and n < 64 and n % 2 else 1.0)

    xs = [x for x, _ in refine(measure, GRID)]
    assert 300 in xs and 301 in xs


def test_the_row_tile_staircase_below_64_rows_is_on_the_grid():
    """The packed kernel takes rows in tiles (12 with AVX-512): each extra tile is one more pass, a step in time per
    step of ~50% at 13 rows. A midpoint test cannot see a staircase; the grid has every row to 64."""
    truth = lambda n: 2e-4 + 1.2e-4 * -(-n // 12) + 1e-6 * n
    points = refine(truth, GRID)
    for n in range(1, 65):
        assert abs(interpolate(curve(points), n) / truth(n) - 1) < 1e-9, n
    coarse = curve([(n, truth(n)) for n in COARSE])
    assert max(abs(interpolate(coarse, n) / truth(n) - 1) for n in range(1, 65)) > 0.15
