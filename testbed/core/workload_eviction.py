"""Workload-aware eviction (`cache.eviction=workload`) after "KVCache Cache in the Wild: Characterizing and
Optimizing KVCache Cache at a Large Cloud Provider" (Wang et al., USENIX ATC 2025).

The paper's policy: within a request category (its workload type and turn number) a block's reuse time
follows an exponential distribution, so the chance that a block idle for t is reused within the next
window `life` is

    ReuseProb_c(t) = P_c * exp(-lambda_c * t) * (1 - exp(-lambda_c * life))

(P_c: the share of the category's blocks that are reused at all; 1 / lambda_c: their mean reuse time),
and the block evicted is the one with the smallest priority (ReuseProb, -offset): the lowest reuse
probability, and among equals the one furthest into its prompt (head blocks are reused more than tails).

Here, per category c (the caching request's `SamplingParams.extra_args["request_class"]`; replay=sessions
sets the turn index, capped at 7; unlabelled requests are one category), learned online:
- a reuse is a prefix hit on a free block, or a block cached again under the hash of a block this queue
  evicted (kept as a ghost, at most GHOSTS x the pool's blocks, oldest dropped first): the workload's
  reuses, not only those the policy let hit; its reuse time is the age at that moment;
- P_c = reuses / (reuses + ghosts dropped unreused), 1 / lambda_c = the mean reuse time (each with a one-
  observation prior: P = 1/2, mean reuse time = life);
- life = the mean age at which cached blocks are evicted (exponentially weighted): the window a reuse
  must fall in to still hit;
- offset = the block's position in its prompt's chain of blocks.

Where it deviates: time is counted in blocks handed out (the cache's churn), not seconds, so a simulation
and a real run age blocks alike and blocks freed between two evictions share an age; the paper's
categories are workload types (text, file, image, API) and turn numbers, here only what the request's
label says (no workload type in our traces); within a category only its least recently freed block
competes (exact, as ReuseProb falls with age), so the offset breaks ties between categories and, within
one, the freeing order (a request's blocks are freed tail first) stands in for it. With one category
the order is LRU's.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from testbed.core.reuse_free_queue import ReuseRankedFreeQueue

GHOSTS = 4  # evicted hashes remembered, per block of the pool
LIFE_WEIGHT = 0.01  # weight of the latest eviction age in the running mean `life`


class _Category:
    __slots__ = ("reuses", "reuse_time", "unreused")

    def __init__(self) -> None:
        self.reuses = 0
        self.reuse_time = 0.0
        self.unreused = 0

    def log_reuse_prob(self, age: int, life: float) -> float:
        """log ReuseProb(age) (logs: exp(-lambda * age) underflows for old blocks)."""
        p = (self.reuses + 0.5) / (self.reuses + self.unreused + 1)
        lam = (self.reuses + 1) / (self.reuse_time + life)
        return math.log(p) - lam * age + math.log(-math.expm1(-lam * life))


class WorkloadAwareFreeQueue(ReuseRankedFreeQueue):
    POP_TICK = 1  # the clock counts blocks handed out

    def __init__(self, blocks):
        blocks = list(blocks)
        self._ghosts: OrderedDict[int, tuple[object, int]] = OrderedDict()  # hash -> (category, stamp)
        self._max_ghosts = GHOSTS * max(len(blocks), 1)
        self.categories: dict[object, _Category] = {}
        self.life = 0.0
        super().__init__(blocks)

    def block_class(self, block) -> object:
        return block.request_class

    def _category(self, key) -> _Category:
        c = self.categories.get(key)
        if c is None:
            c = self.categories[key] = _Category()
        return c

    def _track(self, key) -> None:
        self._category(key)

    def _hit(self, key, stamp: int) -> None:
        """A prefix hit on a free block, or a ghost's hash cached again: a reuse."""
        c = self._category(key)
        c.reuses += 1
        c.reuse_time += self.clock - stamp

    def cached(self, block) -> None:
        """The pool cached a block: if this queue evicted its hash, that was a reuse it missed."""
        ghost = self._ghosts.pop(block.block_hash, None)
        if ghost is not None:
            self._hit(*ghost)

    def _rank(self, key, block, stamp: int) -> tuple:
        life = max(self.life, 1.0)
        return (self.categories[key].log_reuse_prob(self.clock - stamp, life), -block.depth, stamp)

    def _evicted(self, block, key, stamp: int) -> None:
        age = self.clock - stamp
        self.life = age if self.life == 0.0 else self.life + LIFE_WEIGHT * (age - self.life)
        self._ghosts[block.block_hash] = (key, stamp)
        self._ghosts.move_to_end(block.block_hash)
        if len(self._ghosts) > self._max_ghosts:
            _, (old_key, _) = self._ghosts.popitem(last=False)
            self._category(old_key).unreused += 1
