"""Prefix-cache eviction policies (`cache.eviction=`): the order in which free blocks are reused.

A policy is a free-block queue with the FreeBlockQueue interface (append, remove, popleft, iteration,
num_free): `popleft` hands out the block to reuse next, evicting whatever prefix it still caches.

    lru  least recently freed first (the default; a request's blocks are freed tail first, so a
         shared prefix outlives its suffixes)
    lfu  blocks caching nothing first, then the fewest prefix hits, ties broken least recently freed:
         a system prompt hit by many requests survives a burst of one-off prompts
    workload  the lowest predicted reuse probability first: per request category an exponential reuse-time
         model, ties to the block deepest in its prompt ("KVCache Cache in the Wild", ATC 2025;
         testbed/core/workload_eviction.py)
    workload_hist  an earlier variant: an empirical reuse histogram per (label, depth, hit) class, counting
         only hits on cached blocks (testbed/core/workload_hist_eviction.py)
"""

import heapq

EVICTION_POLICIES = {
    "lru": "testbed.core.block_pool:FreeBlockQueue",
    "lfu": "testbed.core.eviction:LFUFreeQueue",
    "workload": "testbed.core.workload_eviction:WorkloadAwareFreeQueue",
    "workload_hist": "testbed.core.workload_hist_eviction:EmpiricalReuseFreeQueue",
}


def make_free_queue(name: str, blocks):
    """The free-block queue `name` (or the import path of the user's own: a class taking the blocks)."""
    from testbed.plugins import load_class

    return load_class("cache eviction policy", EVICTION_POLICIES, name, object)(blocks)  # type: ignore[call-arg]


class LFUFreeQueue:
    """Free blocks in a dict (O(1) removal, iteration in freeing order) plus a lazily pruned heap.

    A block's hash and hit count cannot change while it is free (only held blocks are cached or hit),
    so its heap priority is fixed from append until it leaves."""

    def __init__(self, blocks):
        self._free: dict[int, object] = {}
        self._heap: list[tuple] = []
        self._stamp: dict[int, int] = {}  # block id -> counter of its live heap entry
        self._counter = 0
        for block in blocks:
            self.append(block)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def append(self, block) -> None:
        self._counter += 1
        self._free[block.block_id] = block
        self._stamp[block.block_id] = self._counter
        cached = block.block_hash is not None
        heapq.heappush(self._heap, (cached, block.hit_count if cached else 0, self._counter, block.block_id))
        if len(self._heap) > 4 * len(self._free) + 64:  # drop stale entries now and then
            self._heap = [e for e in self._heap if self._stamp.get(e[3]) == e[2]]
            heapq.heapify(self._heap)

    def remove(self, block) -> None:
        if self._free.pop(block.block_id, None) is None:
            raise AssertionError(f"{block} is not in the free queue")
        del self._stamp[block.block_id]

    def popleft(self):
        while self._heap:
            _, _, stamp, block_id = heapq.heappop(self._heap)
            if self._stamp.get(block_id) == stamp:
                block = self._free.pop(block_id)
                del self._stamp[block_id]
                return block
        raise ValueError("no free blocks")

    def __iter__(self):
        return iter(list(self._free.values()))

    def __len__(self) -> int:
        return len(self._free)
