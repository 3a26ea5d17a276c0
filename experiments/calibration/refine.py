"""Adaptive sampling of a measured 1-D cost curve: a grid segment that is out of line with its neighbours is split,
and its halves again while their midpoints are off the straight line between their ends.

Why: a kernel backend can change code path at a row count (testbed_kernels.cpu.linear sends up to FEW_ROWS rows to
its packed kernel and more to torch's GEMM; on an AMD EPYC one layer's projections take 2.5x as long at 129 rows
as at 128), and a grid interpolates straight across such a cliff, mispricing every step near it (results/fidelity/
README.md, v13's Azure 70% TTFT: steps of 80-128 tokens priced +34-57%). Splitting finds a cliff to one row in about
log2(gap) extra points, on any machine, without knowing where a backend switches.

Noise only adds time, so a point far above the line through its neighbours is timed once more and the lower time
kept (a cliff stays, one slow timing does not); the points furthest above are re-timed first, from a budget of their
own, so a noisy machine's spikes cannot spend the splits' budget. The segment most out of line is split first (a
heap), so noise at a few rows cannot spend the budget before a real cliff is found. A straight or gently bending curve
costs nothing.
"""

import heapq
from collections.abc import Callable


def _at(t: dict, a: int, b: int, x: int) -> float:
    """The straight line through (a, t[a]) and (b, t[b]), at x (also outside [a, b])."""
    return t[a] + (t[b] - t[a]) * (x - a) / (b - a)


def _off(value: float, expected: float) -> float:
    return abs(value - expected) / max(abs(value), 1e-12)


def _out_of_line(t: dict, xs: list[int], i: int) -> float:
    """How far segment xs[i]..xs[i+1] is from its neighbours' lines: each neighbour's line carried to the far
    end; the smaller disagreement (a bend shows on one side, a cliff inside the segment on both)."""
    a, b = xs[i], xs[i + 1]
    offs = []
    if i > 0:
        offs.append(_off(t[b], _at(t, xs[i - 1], a, b)))
    if i + 2 < len(xs):
        offs.append(_off(t[a], _at(t, b, xs[i + 2], a)))
    return min(offs, default=float("inf"))


def refine(
    measure: Callable[[int], float], grid: list[int], tolerance: float = 0.15, budget: int = 24, retimes: int = 12
) -> list:
    """[(x, seconds)] at the grid's points plus at most `budget` split timings and `retimes` re-timings of spikes,
    sorted by x. measure(x) -> seconds."""
    xs = sorted(set(grid))
    t = {x: measure(x) for x in xs}
    spikes = sorted(
        ((t[x] / line, x) for a, x, b in zip(xs, xs[1:], xs[2:]) if t[x] > (1 + tolerance) * (line := _at(t, a, b, x))),
        reverse=True,
    )
    for _, x in spikes[:retimes]:
        t[x] = min(t[x], measure(x))
    heap = [
        (-off, a, b)
        for i, (a, b) in enumerate(zip(xs, xs[1:]))
        if b - a > 1 and (off := _out_of_line(t, xs, i)) > tolerance
    ]
    heapq.heapify(heap)
    while heap and budget > 0:
        _, a, b = heapq.heappop(heap)
        m = (a + b) // 2
        t[m] = measure(m)
        budget -= 1
        off = _off(t[m], _at(t, a, b, m))
        if off > tolerance:
            for lo, hi in ((a, m), (m, b)):
                if hi - lo > 1:
                    heapq.heappush(heap, (-off, lo, hi))
    return sorted(t.items())
