"""Workload-aware eviction with an empirical reuse histogram (`cache.eviction=workload_hist`), in the spirit
of "KVCache Cache in the Wild: Characterizing and Optimizing KVCache Cache at a Large Cloud Provider" (Wang
et al., USENIX ATC 2025).

That study finds that whether a block is reused depends on the kind of request it came from and falls
with the time since its last use, and evicts the block with the lowest predicted reuse probability instead
of the least recently used one. Here a free block's class is (the label of the request that cached it,
its depth in the prefix chain, bucketed by powers of two; whether it was ever hit), and for each class the
queue learns online, from what it sees,

    p(class, age) = (reuses of blocks idle longer than `age`) / (free periods that lasted longer than `age`)

(ages in log2 bins, with a prior of one half weighing as one observation): the empirical chance that a
block of the class that has been idle that long is still reused before it is evicted. A reuse is a hit on
a free block; a free period also ends at eviction (censored). Blocks caching nothing go first, then the
block with the lowest p; within a class p falls with age, so only each class's oldest block competes, and
ties (no data yet) fall back to least recently freed, i.e. LRU.

Where it deviates: the paper's classes are workload types (to-C chat, API calls) and turn numbers; here
the label is what a request's `SamplingParams.extra_args["request_class"]` says (replay=sessions: the turn
index, capped at 7; other replays none), completed by the block's prefix depth and hit history; and
age is counted in blocks freed since (the cache's own churn), not wall-clock seconds, so a simulation and a
real run age blocks alike. The paper fits an exponential per class; this uses the empirical histogram, and
counts only hits on blocks still cached as reuses (a block evicted and asked for again counts as never
reused, so a class the policy evicts looks less reusable: a feedback loop). `cache.eviction=workload`
(testbed/core/workload_eviction.py) is the closer version.
"""

from __future__ import annotations

from testbed.core.reuse_free_queue import ReuseRankedFreeQueue

NUM_BINS = 48
PRIOR = 0.5  # a class's reuse probability before it has data, weighing as one observation


def _bin(age: int) -> int:
    return min(age.bit_length(), NUM_BINS - 1)


class _ClassStats:
    __slots__ = ("reused", "ended", "suffix", "dirty")

    def __init__(self) -> None:
        self.reused = [0] * NUM_BINS  # reuses by age bin
        self.ended = [0] * NUM_BINS  # free periods ended (reuse or eviction) by age bin
        self.suffix: list[float] = [PRIOR] * NUM_BINS
        self.dirty = False

    def probability(self, age: int) -> float:
        if self.dirty:
            r = e = 0
            for b in range(NUM_BINS - 1, -1, -1):
                r += self.reused[b]
                e += self.ended[b]
                self.suffix[b] = (r + PRIOR) / (e + 1)
            self.dirty = False
        return self.suffix[_bin(age)]


class EmpiricalReuseFreeQueue(ReuseRankedFreeQueue):
    APPEND_TICK = 1  # the clock counts blocks freed

    def __init__(self, blocks):
        self.stats: dict[tuple, _ClassStats] = {}
        super().__init__(blocks)

    def block_class(self, block) -> tuple:
        return (block.request_class, block.depth.bit_length(), block.hit_count > 0)

    def _track(self, key) -> None:
        if key not in self.stats:
            self.stats[key] = _ClassStats()

    def _end(self, key: tuple, stamp: int, reused: bool) -> None:
        stats, b = self.stats[key], _bin(self.clock - stamp)
        stats.ended[b] += 1
        stats.reused[b] += reused
        stats.dirty = True

    def _hit(self, key, stamp: int) -> None:
        self._end(key, stamp, reused=True)  # a hit on a free block: a reuse

    def _rank(self, key, block, stamp: int) -> tuple:
        return (self.stats[key].probability(self.clock - stamp), stamp)

    def _evicted(self, block, key, stamp: int) -> None:
        self._end(key, stamp, reused=False)
