"""The skeleton both workload-aware eviction policies share (testbed/core/workload_eviction.py,
workload_hist_eviction.py): free blocks caching nothing go first, in freeing order; the others wait in one
queue per class, in freeing order, and the class heads compete: the one with the lowest `_rank` is evicted.
A subclass says what a block's class is, how to rank a head, what its clock counts, and what it learns
from a hit on a free block and from an eviction."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

EMPTY = object()  # the class of a free block caching nothing


class ReuseRankedFreeQueue:
    APPEND_TICK = 0  # clock steps per block freed (append)
    POP_TICK = 0  # ... and per block handed out (popleft)

    def __init__(self, blocks):
        self._empty: OrderedDict[int, Any] = OrderedDict()  # free blocks caching nothing, freeing order
        self._queues: dict[Any, OrderedDict[int, Any]] = {}  # per class, freeing order
        self._where: dict[int, Any] = {}  # block id -> its class (EMPTY: caching nothing)
        self._stamp: dict[int, int] = {}  # block id -> clock when freed
        self.clock = 0
        for block in blocks:
            self.append(block)

    def block_class(self, block) -> Any:
        raise NotImplementedError

    def _track(self, key) -> None:
        """A block of class `key` is free (its statistics exist from now on)."""

    def _rank(self, key, block, stamp: int) -> Any:
        raise NotImplementedError

    def _hit(self, key, stamp: int) -> None:
        """A prefix hit on a free block of class `key`, freed at `stamp`."""

    def _evicted(self, block, key, stamp: int) -> None:
        """`block` of class `key`, freed at `stamp`, is evicted."""

    @property
    def num_free(self) -> int:
        return len(self._where)

    def append(self, block) -> None:
        self.clock += self.APPEND_TICK
        bid = block.block_id
        self._stamp[bid] = self.clock
        if block.block_hash is None:
            self._where[bid] = EMPTY
            self._empty[bid] = block
            return
        key = self.block_class(block)
        self._where[bid] = key
        self._queues.setdefault(key, OrderedDict())[bid] = block
        self._track(key)

    def remove(self, block) -> None:
        bid = block.block_id
        if bid not in self._where:
            raise AssertionError(f"{block} is not in the free queue")
        key = self._where.pop(bid)
        stamp = self._stamp.pop(bid)
        if key is EMPTY:
            del self._empty[bid]
        else:
            del self._queues[key][bid]
            self._hit(key, stamp)

    def popleft(self):
        self.clock += self.POP_TICK
        if self._empty:
            bid, block = self._empty.popitem(last=False)
            del self._where[bid], self._stamp[bid]
            return block
        best = None
        for key, queue in self._queues.items():
            if not queue:
                continue
            bid, block = next(iter(queue.items()))
            rank = self._rank(key, block, self._stamp[bid])
            if best is None or rank < best[0]:
                best = (rank, key, bid)
        if best is None:
            raise ValueError("no free blocks")
        _, key, bid = best
        block = self._queues[key].pop(bid)
        del self._where[bid]
        self._evicted(block, key, self._stamp.pop(bid))
        return block

    def __iter__(self):
        blocks = [*self._empty.values()] + [b for q in self._queues.values() for b in q.values()]
        return iter(sorted(blocks, key=lambda b: self._stamp[b.block_id]))

    def __len__(self) -> int:
        return len(self._where)
