"""Fixed-size KV blocks: ref counts, a free queue in eviction order, and the prefix-cache hash map.

Invariant: a block is in the free queue iff its ref count is 0. A freed block keeps its hash (and
stays hittable) until it is handed out again, which is when it leaves the hash map.

Duplicates: two requests that compute the same prefix at the same time each fill a block with the same
hash. As in vLLM v1 (BlockHashToBlockMap), both stay hittable: a lookup returns the first one cached,
and when that one is evicted the next takes its place, so every block counted as cached can be hit.
"""

from collections.abc import Iterable

from testbed.core.access_log import KVAccessLog


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free", "hit_count", "depth", "request_class")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None
        self.hit_count = 0  # prefix hits since cached (for frequency-aware eviction)
        self.depth = 0  # position in its prefix chain when cached (for workload-aware eviction)
        self.request_class: object = None  # the caching request's workload label (workload-aware eviction)

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class FreeBlockQueue:
    """Doubly linked list of free blocks: pop from the head (next to evict), append at the tail,
    remove from anywhere in O(1) when a cached free block is hit again. Head-first order is LRU."""

    def __init__(self, blocks: list[KVCacheBlock]):
        self.head = KVCacheBlock(-1)
        self.tail = KVCacheBlock(-1)
        self.head.next_free, self.tail.prev_free = self.tail, self.head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def append(self, block: KVCacheBlock) -> None:
        last = self.tail.prev_free
        last.next_free, block.prev_free = block, last  # type: ignore[union-attr]
        block.next_free, self.tail.prev_free = self.tail, block
        self.num_free += 1

    def extend(self, blocks: list[KVCacheBlock]) -> None:
        """append() of each block in order, the list closed once at the end."""
        tail = self.tail
        last = tail.prev_free
        for block in blocks:
            last.next_free, block.prev_free = block, last  # type: ignore[union-attr]
            last = block
        last.next_free, tail.prev_free = tail, last  # type: ignore[union-attr]
        self.num_free += len(blocks)

    def remove(self, block: KVCacheBlock) -> None:
        if block.prev_free is None:
            raise AssertionError(f"{block} is not in the free queue")
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free  # type: ignore[union-attr]
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def popleft(self) -> KVCacheBlock:
        if self.num_free == 0:
            raise ValueError("no free blocks")
        block = self.head.next_free  # remove(), inlined: this runs for every block handed out
        nxt = block.next_free  # type: ignore[union-attr]
        self.head.next_free, nxt.prev_free = nxt, self.head  # type: ignore[union-attr]
        block.prev_free = block.next_free = None  # type: ignore[union-attr]
        self.num_free -= 1
        return block  # type: ignore[return-value]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """n poplefts at once (the caller checked there are n), in the same order."""
        head = self.head
        out: list[KVCacheBlock] = []
        append, block = out.append, head.next_free
        for _ in range(n):
            append(block)  # type: ignore[arg-type]
            nxt = block.next_free  # type: ignore[union-attr]
            block.prev_free = block.next_free = None  # type: ignore[union-attr]
            block = nxt
        head.next_free, block.prev_free = block, head  # type: ignore[union-attr]
        self.num_free -= n
        return out

    def __iter__(self):
        block = self.head.next_free
        while block is not self.tail:
            yield block
            block = block.next_free  # type: ignore[union-attr]

    def __len__(self) -> int:
        return self.num_free


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True, eviction: str = "lru"):
        from testbed.core.eviction import make_free_queue

        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least 1 block, got num_blocks={num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = make_free_queue(eviction, self.blocks)  # eviction order (testbed.core.eviction)
        self._note_cached = getattr(self.free_queue, "cached", None)  # a policy that learns from re-caching
        self.hash_to_block: dict[int, KVCacheBlock] = {}  # the block a lookup of the hash returns
        self.duplicates: dict[int, list[KVCacheBlock]] = {}  # further blocks with that hash, in caching order
        self.num_cached_free = 0  # free blocks that still hold a cached prefix
        self.num_evictions = 0
        self.access_log: KVAccessLog | None = None  # while a recorder wants the block-access stream
        self.on_evict = None  # called with a block about to lose its cached prefix (the host KV tier)

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        return self.hash_to_block.get(block_hash)

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Hand out n free blocks (evicting their cached content) with ref count 1."""
        if n > self.free_queue.num_free:
            raise ValueError(f"asked for {n} blocks, only {self.free_queue.num_free} free")
        queue, hash_to_block, duplicates = self.free_queue, self.hash_to_block, self.duplicates
        taken: Iterable[KVCacheBlock]
        if type(queue) is FreeBlockQueue and self.on_evict is None:  # nothing below can raise: all at once
            taken = queue.popleft_n(n)
        else:  # one at a time: blocks not reached stay free if on_evict raises
            popleft = queue.popleft
            taken = (popleft() for _ in range(n))
        out = []
        evicted = 0
        try:
            for block in taken:
                h = block.block_hash
                if h is not None:  # it still caches a prefix: evict it (_evict inlined: in a full cache, every block)
                    if self.on_evict is not None:
                        self.on_evict(block)
                    if h in duplicates or hash_to_block.get(h) is not block:
                        self._unmap(block)
                    else:
                        del hash_to_block[h]
                    block.block_hash = None
                    block.hit_count = 0
                    evicted += 1
                block.ref_cnt = 1
                out.append(block)
        finally:
            self.num_cached_free -= evicted
            self.num_evictions += evicted
        return out

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self.on_evict is not None:
            self.on_evict(block)
        self.num_cached_free -= 1
        self.num_evictions += 1
        self._unmap(block)
        block.block_hash = None
        block.hit_count = 0

    def _unmap(self, block: KVCacheBlock) -> None:
        """Take a block out of the hash map; a duplicate with the same hash takes its place."""
        h = block.block_hash
        assert h is not None
        dups = self.duplicates.get(h)
        if self.hash_to_block.get(h) is block:
            if dups:
                self.hash_to_block[h] = dups.pop(0)
            else:
                del self.hash_to_block[h]
        elif dups is not None:
            dups.remove(block)
        if dups is not None and not dups:
            del self.duplicates[h]

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks, pulling free ones out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
                if block.block_hash is not None:
                    self.num_cached_free -= 1
            block.ref_cnt += 1
            block.hit_count += 1

    def share(self, blocks: Iterable[KVCacheBlock]) -> None:
        """One more holder for blocks already held (a parallel-sampling fork): none is in the free queue."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise AssertionError(f"sharing free {block}")
            block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop a reference; blocks reaching 0 join the tail of the free queue in the order given
        (callers pass a request's blocks tail-first, so its prefix is evicted last)."""
        freed: list[KVCacheBlock] = []
        try:
            for block in blocks:
                if block.ref_cnt <= 0:
                    raise AssertionError(f"double free of {block}")
                block.ref_cnt -= 1
                if block.ref_cnt == 0:
                    freed.append(block)
        finally:  # a double free mid-way still queues the blocks released before it
            queue = self.free_queue
            if type(queue) is FreeBlockQueue:
                queue.extend(freed)
            else:
                for block in freed:
                    queue.append(block)
            self._released([block.block_hash for block in freed])

    def _released(self, released: list[int | None]) -> None:
        """Count and log the blocks free_blocks put in the free queue (their hashes, None: no prefix)."""
        if released:
            self.num_cached_free += len(released) - released.count(None)
            if self.access_log is not None:
                self.access_log.release_all(released)

    def cache_block(self, block: KVCacheBlock, block_hash: int, depth: int = 0, request_class: object = None) -> None:
        """Register a newly full block under its chained hash (a duplicate stays hittable, see above);
        depth: its position in the prompt's chain of blocks; request_class: the caching request's label."""
        if not self.enable_caching or block.block_hash is not None:
            return
        block.block_hash = block_hash
        block.depth = depth
        block.request_class = request_class
        if self._note_cached is not None:
            self._note_cached(block)
        if self.access_log is not None:
            self.access_log.cache(block_hash)
        first = self.hash_to_block.setdefault(block_hash, block)
        if first is not block:
            self.duplicates.setdefault(block_hash, []).append(block)

    def cache_blocks(self, blocks: list[KVCacheBlock], hashes: list[int], start: int, end: int, request_class) -> None:
        """cache_block(blocks[i], hashes[i], i, request_class) for i in [start, end), in order."""
        self.cache_ranges([(blocks, hashes, start, end, request_class)])

    def cache_ranges(self, ranges: list[tuple[list[KVCacheBlock], list[int], int, int, object]]) -> None:
        """cache_blocks(*r) for each r = (blocks, hashes, start, end, request_class), in order, the access
        log written once."""
        if not self.enable_caching:
            return
        hash_to_block, logged, note = self.hash_to_block, [], self._note_cached
        for blocks, hashes, start, end, request_class in ranges:
            for i in range(start, end):
                block = blocks[i]
                if block.block_hash is not None:
                    continue
                block_hash = hashes[i]
                block.block_hash = block_hash
                block.depth = i
                block.request_class = request_class
                if note is not None:
                    note(block)
                logged.append(block_hash)
                first = hash_to_block.setdefault(block_hash, block)
                if first is not block:
                    self.duplicates.setdefault(block_hash, []).append(block)
        if self.access_log is not None and logged:
            self.access_log.cache_all(logged)

    @property
    def plain_lru(self) -> bool:
        """The plain LRU free queue, which learns nothing from caching, and no eviction hook."""
        return type(self.free_queue) is FreeBlockQueue and self._note_cached is None and self.on_evict is None

    def head_cached(self, n: int) -> list[bool]:
        """Whether each of the next n blocks get_new_blocks would hand out still caches a prefix (plain_lru:
        the queue's first n)."""
        out = []
        block = self.free_queue.head.next_free
        for _ in range(n):
            out.append(block.block_hash is not None)
            block = block.next_free
        return out

    def uncache_block(self, block: KVCacheBlock) -> None:
        """Forget a held block's hash (its content is about to be overwritten, e.g. a rejected draft)."""
        if block.block_hash is not None:
            self._unmap(block)
        block.block_hash = None

    def check_invariants(self) -> None:
        """Consistency of ref counts, free queue and hash map (used by the property tests)."""
        in_queue = set()
        for block in self.free_queue:
            assert block.block_id not in in_queue, f"{block} twice in the free queue"
            in_queue.add(block.block_id)
        assert len(in_queue) == self.free_queue.num_free
        for block in self.blocks:
            assert block.ref_cnt >= 0, block
            assert (block.ref_cnt == 0) == (block.block_id in in_queue), block
        for h, block in self.hash_to_block.items():
            assert block.block_hash == h, (h, block)
        mapped = [b.block_id for b in self.hash_to_block.values()]
        for h, dups in self.duplicates.items():
            assert dups and h in self.hash_to_block, (h, dups)
            assert all(b.block_hash == h for b in dups), (h, dups)
            mapped += [b.block_id for b in dups]
        assert len(mapped) == len(set(mapped)), "a block is mapped twice"
        hashed = sorted(b.block_id for b in self.blocks if b.block_hash is not None)
        assert sorted(mapped) == hashed, "every hashed block is hittable (in the map), and only those"
        cached_free = sum(1 for b in self.blocks if b.ref_cnt == 0 and b.block_hash is not None)
        assert cached_free == self.num_cached_free, (cached_free, self.num_cached_free)
