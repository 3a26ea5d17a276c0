"""The paged cache's state after each step of a simulated decode run, kept as the counters it changes by.

A decode run (testbed.sim.decode_runs) takes blocks at a few of its steps; between them the cache's
counters (PagedAllocator.counters: free blocks, cached free blocks, held blocks, internal slots) stay the
same and only the running requests' computed tokens grow, by the batch size each step. CounterSpans
keeps one entry per span of such steps and gives each step's state as PagedAllocator.compact_stats gives
it (a KVCacheStats field tuple, testbed.step_stats.kv_compact): one step, all of them in order, or every
step of many runs as int64 columns for the steps table (stats_table), with no tuple per step.
"""

from bisect import bisect_right
from collections.abc import Iterator
from itertools import accumulate, chain

import numpy as np

# Inputs within this bound keep every value stats_table computes (sums of a few products of two inputs)
# exact in int64, as the tuples' Python ints are.
_BOUND = 2**30


class CounterSpans:
    """Consecutive spans of steps: span s has counts[s] steps, the first with computed[s] computed tokens
    (summed over the running requests) and each next one per_step more, the cache's counters during all
    of them counters[s]."""

    __slots__ = ("num_blocks", "block_size", "per_step", "counts", "computed", "counters")

    def __init__(self, num_blocks: int, block_size: int, per_step: int):
        self.num_blocks, self.block_size, self.per_step = num_blocks, block_size, per_step
        self.counts: list[int] = []
        self.computed: list[int] = []
        self.counters: list[tuple[int, int, int, int]] = []

    def add(self, count: int, computed: int, counters: tuple[int, int, int, int]) -> None:
        """`count` more steps (none: nothing), the first with `computed` computed tokens."""
        if count > 0:
            self.counts.append(count)
            self.computed.append(computed)
            self.counters.append(counters)

    def __len__(self) -> int:
        return sum(self.counts)

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return iter(self.tuples())

    def __getitem__(self, j: int) -> tuple[int, ...]:
        ends = list(accumulate(self.counts))
        if j < 0:
            j += len(self)
        if not 0 <= j < (ends[-1] if ends else 0):
            raise IndexError(f"step {j} of a run of {len(self)}")
        s = bisect_right(ends, j)
        return self._tuple(self.computed[s] + (j - ends[s] + self.counts[s]) * self.per_step, *self.counters[s])

    def _tuple(self, computed: int, free: int, cached: int, held: int, internal: int) -> tuple[int, ...]:
        """PagedAllocator.compact_stats with these counters and computed tokens."""
        nb, bs = self.num_blocks, self.block_size
        slack = held * bs - computed
        token = (nb - free) * bs - slack
        return (nb, bs, nb - free, token, slack, cached, free, token, slack - internal, internal, 0, free * bs)

    def tuples(self) -> list[tuple[int, ...]]:
        """Each step's tuple, in order."""
        bs, num_blocks, per_step = self.block_size, self.num_blocks, self.per_step
        out: list[tuple[int, ...]] = []
        for count, c, (free, cached, held, internal) in zip(self.counts, self.computed, self.counters):
            used_blocks = num_blocks - free
            used, held, free_slots = used_blocks * bs, held * bs, free * bs
            computed = range(c, c + count * per_step, per_step) if per_step else [c] * count
            out += [
                (
                    num_blocks,
                    bs,
                    used_blocks,
                    used - (held - k),
                    held - k,
                    cached,
                    free,
                    used - (held - k),
                    held - k - internal,
                    internal,
                    0,
                    free_slots,
                )
                for k in computed
            ]
        return out


def stats_table(runs: list[CounterSpans]) -> np.ndarray | None:
    """The tuples of every step of these runs, one run after another, as an int64 array with one row per
    tuple field (the steps table's columns); None unless every number they are made of is a plain int
    within +-2**30 (then each value equals the tuple's Python int). Each field is read into one array (no
    tuple per span): its values' types checked in Python, their range in numpy."""
    counters = list(chain.from_iterable(s.counters for s in runs))
    if set(map(len, counters)) - {4}:
        return None
    per_run = list(chain.from_iterable((s.num_blocks, s.block_size, s.per_step) for s in runs))
    counts = list(chain.from_iterable(s.counts for s in runs))
    computed = list(chain.from_iterable(s.computed for s in runs))
    fields = (per_run, counts, computed, list(chain.from_iterable(counters)))
    if set(map(type, chain.from_iterable(fields))) - {int}:
        return None
    try:
        arrays = [np.fromiter(field, dtype=np.int64, count=len(field)) for field in fields]
    except OverflowError:
        return None
    if any(len(a) and not (a.min() >= -_BOUND and a.max() < _BOUND) for a in arrays):
        return None
    per_run_array, lengths, computed_array, counters_array = arrays
    spans = np.array([len(s.counts) for s in runs], dtype=np.int64)
    nb, bs, per_step = np.repeat(np.repeat(per_run_array.reshape(-1, 3), spans, axis=0), lengths, axis=0).T
    free, cached, held, internal = np.repeat(counters_array.reshape(-1, 4), lengths, axis=0).T
    within = np.arange(len(nb), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    slack = held * bs - (np.repeat(computed_array, lengths) + within * per_step)
    token = (nb - free) * bs - slack
    zero = np.zeros(len(nb), dtype=np.int64)
    return np.stack([nb, bs, nb - free, token, slack, cached, free, token, slack - internal, internal, zero, free * bs])
