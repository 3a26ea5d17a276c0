"""LRU hit rates at every cache capacity in one pass over a block-access stream (Mattson et al., "Evaluation
techniques for storage hierarchies", IBM Systems Journal 1970: LRU is a stack algorithm, so one pass
gives each access's stack distance and with it the hits at every capacity).

The stack is the engine's free-queue order (testbed.core.block_pool: LRU evicts least recently freed).
A `release` puts its block on top (a block holding no full prefix is a fresh item that is never hit); a
`cache` puts a newly registered block on top too. A `lookup` does not move anything: its blocks' depths
are read as they stand, and block i of the prompt is a hit at capacity C iff blocks 0..i all sit within
the top C (the engine hits only a leading run of cached blocks). So a lookup's i-th block has distance
d_i = 1 + max over j <= i of the number of distinct items above block j, and the hit rate at C is
block_size * #{d_i <= C} / prompt tokens, the engine's prefix_hit_rate.

Exact for an LRU pool of C blocks when one request runs at a time (nothing is held at a lookup, and the
request's own blocks, held while it runs, are what it releases). With concurrent requests the pool's
held blocks are not evictable and hits on blocks other requests hold are counted by the engine but
only approximated here (their `cache` event is their last access until released); the infinite-cache
ideal is exact in any case: a block is hittable iff it was registered before, and its prefix too.

Depths come from a Fenwick tree over access times (one bit per item, at its latest access): O(log n)
per event.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from testbed.core.access_log import CACHE, LOOKUP, RELEASE

INF = np.iinfo(np.int64).max


class _Fenwick:
    def __init__(self, n: int):
        self.n = n
        self.tree = [0] * (n + 1)

    def add(self, i: int, v: int) -> None:
        i += 1
        while i <= self.n:
            self.tree[i] += v
            i += i & -i

    def prefix(self, i: int) -> int:  # sum of [0, i)
        s = 0
        while i > 0:
            s += self.tree[i]
            i -= i & -i
        return s


@dataclass
class StackResult:
    block_size: int
    prompt_tokens: int  # over every lookup
    distances: np.ndarray  # one per looked-up block: its prefix stack distance, INF when never cached before
    reuse_distances: np.ndarray  # per looked-up block seen before: its own stack distance (no prefix rule)
    reuse_counts: np.ndarray  # per distinct block hash: how many lookups found it registered before
    num_lookups: int
    num_items: int  # distinct items ever on the stack

    def hit_rate(self, capacity) -> np.ndarray:
        """Hit rate (tokens from the cache / prompt tokens) at each capacity in blocks."""
        finite = np.sort(self.distances[self.distances != INF])
        hits = np.searchsorted(finite, np.asarray(capacity), side="right")
        return hits * self.block_size / self.prompt_tokens if self.prompt_tokens else hits * 0.0

    @property
    def ideal_hit_rate(self) -> float:
        """An infinite cache: every block registered before, with its whole prefix, is a hit."""
        n = int((self.distances != INF).sum())
        return n * self.block_size / self.prompt_tokens if self.prompt_tokens else 0.0

    def curve(self, max_capacity: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(capacities 1..max, hit rate at each): every capacity up to the largest useful one."""
        finite = self.distances[self.distances != INF]
        top = max_capacity or int(finite.max(initial=1))
        caps = np.arange(1, top + 1)
        return caps, self.hit_rate(caps)

    def top_share(self, fraction: float = 0.1) -> float | None:
        """Share of all reuses that go to the most reused `fraction` of the blocks that were reused."""
        counts = np.sort(self.reuse_counts[self.reuse_counts > 0])[::-1]
        if not len(counts):
            return None
        k = max(1, int(np.ceil(fraction * len(counts))))
        return float(counts[:k].sum() / counts.sum())


def stack_distances(events, block_size: int) -> StackResult:
    """events: (kind, request_id, num_tokens, hashes) in stream order (KVAccessLog.events or the rows of
    kv_accesses.parquet)."""
    events = list(events)
    n_access = sum(1 for k, _, _, _ in events if k != LOOKUP)
    tree = _Fenwick(max(1, n_access))
    last: dict[int, int] = {}  # block hash -> time of its latest access (its bit in the tree)
    reuse: dict[int, int] = {}
    t = 0
    live = 0  # items on the stack
    distances: list[int] = []
    own: list[int] = []
    prompt_tokens = num_lookups = 0
    for kind, _rid, num_tokens, hashes in events:
        if kind == LOOKUP:
            num_lookups += 1
            prompt_tokens += int(num_tokens)
            worst = 0
            for h in hashes:
                h = int(h)
                if h in last:  # registered before: hittable in a large enough cache
                    depth = live - tree.prefix(last[h] + 1) + 1  # 1 + items accessed after it
                    own.append(depth)
                    reuse[h] = reuse.get(h, 0) + 1
                    worst = INF if worst == INF else max(worst, depth)
                else:
                    worst = INF
                distances.append(worst)
        elif kind in (CACHE, RELEASE):
            if len(hashes):
                h = int(hashes[0])
                old = last.get(h)
                if old is not None:
                    tree.add(old, -1)
                    live -= 1
                last[h] = t
            tree.add(t, 1)
            live += 1
            t += 1
        else:
            raise ValueError(f"unknown access event kind {kind!r}")
    return StackResult(
        block_size=block_size,
        prompt_tokens=prompt_tokens,
        distances=np.asarray(distances, dtype=np.int64),
        reuse_distances=np.asarray(own, dtype=np.int64),
        reuse_counts=np.asarray(list(reuse.values()), dtype=np.int64),
        num_lookups=num_lookups,
        num_items=t,
    )
