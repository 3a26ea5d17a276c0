"""Per-request block tables over the block pool: prefix lookup, slot allocation, freeing, accounting."""
from testbed.core.allocators.base import KVAllocator, KVCacheStats  # noqa: F401 (KVCacheStats re-exported)
from testbed.core.block_pool import BlockPool, KVCacheBlock
from testbed.request import Request


def hash_block(parent_hash: int | None, token_ids) -> int:
    """Chained block hash: equal hashes mean equal whole prefixes, not just equal blocks."""
    return hash((parent_hash, *token_ids))


class KVCacheManager(KVAllocator):
    """The paged allocator (`cache=paged`): any free block serves any request, prefixes are shared."""
    name = "paged"

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 eviction: str = "lru"):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching, eviction=eviction)
        self.req_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_num_hashed: dict[str, int] = {}   # full blocks already registered in the hash map
        self._init_counters()

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def num_held_blocks(self, request_id: str) -> int:
        return len(self.req_blocks.get(request_id, ()))

    def num_cached_free_blocks(self) -> int:
        return self.pool.num_cached_free

    def _update_hashes(self, request: Request, num_tokens: int) -> None:
        """Extend request.block_hashes to cover the full blocks among its first num_tokens tokens."""
        hashes, bs, tokens = request.block_hashes, self.block_size, request.all_token_ids
        for i in range(len(hashes), min(num_tokens, len(tokens)) // bs):
            hashes.append(hash_block(hashes[-1] if hashes else None, tokens[i * bs:(i + 1) * bs]))

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of a request not yet holding blocks: (blocks, num computed tokens).

        At least one token is always left to compute, since sampling needs its logits."""
        if not self.enable_prefix_caching:
            return [], 0
        max_hit_tokens = request.num_tokens - 1
        self._update_hashes(request, max_hit_tokens)
        blocks = []
        for block_hash in request.block_hashes[:max_hit_tokens // self.block_size]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks, len(blocks) * self.block_size

    def can_allocate(self, request: Request, num_new_tokens: int,
                     computed_blocks: list[KVCacheBlock] = (), num_lookahead_tokens: int = 0) -> int | None:
        """Blocks to take from the free queue for this allocation, or None if they are not there."""
        held = self.req_blocks.get(request.request_id, ())
        total = request.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens
        num_new_blocks = max(0, self.blocks_needed(total + num_lookahead_tokens) - len(held) - len(computed_blocks))
        # hit blocks sitting in the free queue leave it when touched
        num_revived = sum(1 for b in computed_blocks if b.ref_cnt == 0)
        if num_new_blocks + num_revived > self.pool.num_free_blocks:
            return None
        return num_new_blocks

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_blocks: list[KVCacheBlock] = (), num_lookahead_tokens: int = 0,
                       num_tokens_to_cache: int | None = None) -> list[KVCacheBlock] | None:
        """Make room for num_new_tokens after the computed ones (and any prefix hits given).

        Returns the newly taken blocks, or None (and changes nothing) if the pool is short.
        Full blocks whose tokens are known are registered for prefix caching."""
        num_new_blocks = self.can_allocate(request, num_new_tokens, computed_blocks, num_lookahead_tokens)
        if num_new_blocks is None:
            return None
        blocks = self.req_blocks.setdefault(request.request_id, [])
        if computed_blocks:
            self.pool.touch(computed_blocks)
            blocks.extend(computed_blocks)
        new_blocks = self.pool.get_new_blocks(num_new_blocks)
        blocks.extend(new_blocks)
        if self.enable_prefix_caching:
            end = request.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens
            self._cache_full_blocks(request, blocks, min(end, request.num_tokens)
                                    if num_tokens_to_cache is None else num_tokens_to_cache)
        return new_blocks

    def _cache_full_blocks(self, request: Request, blocks: list[KVCacheBlock], num_tokens: int) -> None:
        rid = request.request_id
        num_full = min(num_tokens // self.block_size, len(blocks))
        start = self.req_num_hashed.get(rid, 0)
        if num_full <= start:
            return
        self._update_hashes(request, num_full * self.block_size)
        for i in range(start, num_full):
            self.pool.cache_block(blocks[i], request.block_hashes[i])
        self.req_num_hashed[rid] = num_full

    def free(self, request: Request) -> None:
        """Release a request's blocks, tail first so its shared prefix is the last to be evicted."""
        blocks = self.req_blocks.pop(request.request_id, [])
        self.req_num_hashed.pop(request.request_id, None)
        self.pool.free_blocks(reversed(blocks))

    def trim(self, request: Request, num_tokens: int) -> None:
        """Give back blocks beyond what num_tokens needs (after rejected speculative tokens)."""
        blocks = self.req_blocks.get(request.request_id, [])
        keep = self.blocks_needed(num_tokens)
        if len(blocks) > keep:
            surplus = blocks[keep:]
            del blocks[keep:]
            for block in surplus:
                if block.ref_cnt == 1:
                    self.pool.uncache_block(block)
            self.pool.free_blocks(reversed(surplus))
        num_full = num_tokens // self.block_size
        if self.req_num_hashed.get(request.request_id, 0) > num_full:
            self.req_num_hashed[request.request_id] = num_full

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(request_id, ())]
