"""Per-request block tables over the block pool: prefix lookup, slot allocation, freeing, accounting."""

from collections.abc import Sequence

from testbed.core.allocators import decode_run_slots
from testbed.core.allocators.base import CopyKind, KVAllocator, KVCacheStats
from testbed.core.allocators.block_hash import ROOT_HASH
from testbed.core.allocators.block_hash import hash_block as hash_block  # re-exported
from testbed.core.allocators.counter_spans import CounterSpans
from testbed.core.block_pool import BlockPool, KVCacheBlock
from testbed.request import Request


class PagedAllocator(KVAllocator):
    """The paged allocator (`cache=paged`): any free block serves any request, prefixes are shared.

    Parallel sampling (testbed.sequence_group): `fork` makes a sequence share another's prompt blocks by ref
    count; a sequence about to write into a block someone else still holds gets a private copy first (copy
    on write, vLLM v0's rule): only the partly filled prompt block of a fork is ever written while shared,
    since prefix hits and fork share only computed tokens and writes start past them."""

    name = "paged"
    supports_fork = True
    supports_host_tier = True
    pool: BlockPool

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, eviction: str = "lru"):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching, eviction=eviction)
        self.req_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_num_hashed: dict[str, int] = {}  # full blocks already registered in the hash map
        # request id -> up to how many tokens (computed + new) allocate_slots has nothing to do: the held
        # blocks have room and no further block becomes full (set by the full path, dropped on trim/free)
        self.req_fast_limit: dict[str, int] = {}
        # kept as blocks are taken and given back, so that stats_from_counters() is O(1):
        self.num_held_blocks_total = 0  # sum of len(req_blocks[rid]) (a shared block counts per holder)
        self.num_internal_slots = 0  # sum of held slots beyond each holder's final length
        # forked requests whose next write may land in a block they share (checked by the full allocation path)
        self.req_may_share: set[str] = set()
        self.num_cow_copies = 0
        self.host_tier = None  # testbed.core.host_tier.HostKVTier, when cache.host_tier_gb is set
        self.host_hits = 0  # of prefix_hits, tokens loaded from the host tier
        self._init_counters()

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
        first, end = len(hashes), min(num_tokens, len(tokens)) // bs
        if first >= end:
            return
        parent = hashes[-1] if hashes else ROOT_HASH
        append = hashes.append
        # hash_block, inlined: a prompt's every block, its tokens taken bs at a time as tuples
        for block in zip(*[iter(tokens[first * bs : end * bs])] * bs):
            parent = hash((parent,) + block)  # the tuple (parent, *block), made by concatenation
            append(parent)

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of a request not yet holding blocks: (blocks, num computed tokens).

        At least one token is always left to compute, since sampling needs its logits."""
        if not self.enable_prefix_caching or request.prompt_logprobs is not None:
            return [], 0  # prompt logprobs need every prompt position computed (as vLLM v1)
        max_hit_tokens = request.num_tokens - 1
        self._update_hashes(request, max_hit_tokens)
        if self.pool.access_log is not None:
            self.pool.access_log.mark()
        blocks = []
        eligible = request.block_hashes[: max_hit_tokens // self.block_size]
        cached = self.pool.hash_to_block.get  # BlockPool.get_cached_block, per prompt block
        for block_hash in eligible:
            block = cached(block_hash)
            if block is None:
                break
            blocks.append(block)
        if self.host_tier is not None and len(blocks) < len(eligible):
            blocks += self.host_tier.load(request.request_id, eligible[len(blocks) :], blocks)
        return blocks, len(blocks) * self.block_size

    def start_access_log(self):
        """Record the block-access stream from now on (testbed.core.access_log); returns the log."""
        from testbed.core.access_log import KVAccessLog

        self.pool.access_log = KVAccessLog()
        return self.pool.access_log

    def stop_access_log(self) -> None:
        self.pool.access_log = None

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int, request=None) -> None:
        super().record_prefix_lookup(num_tokens, num_hit_tokens)
        if self.host_tier is not None and request is not None:
            self.host_hits += min(num_hit_tokens, self.host_tier.take_loaded(request.request_id) * self.block_size)
        log = self.pool.access_log
        if log is not None and request is not None:
            eligible = (request.num_tokens - 1) // self.block_size
            hashes = request.block_hashes[:eligible] if self.enable_prefix_caching else []
            log.lookup(request.request_id, num_tokens, hashes)

    def can_allocate(
        self,
        request: Request,
        num_new_tokens: int,
        computed_blocks: Sequence[KVCacheBlock] = (),
        num_lookahead_tokens: int = 0,
    ) -> int | None:
        """Blocks to take from the free queue for this allocation, or None if they are not there."""
        rid = request.request_id
        held = self.req_blocks.get(rid, ())
        total = request.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens
        num_new_blocks = max(0, self.blocks_needed(total + num_lookahead_tokens) - len(held) - len(computed_blocks))
        # hit blocks sitting in the free queue leave it when touched
        num_revived = sum(1 for b in computed_blocks if b.ref_cnt == 0) if computed_blocks else 0
        num_copies = len(self._shared_writes(request, held)) if rid in self.req_may_share else 0
        if num_new_blocks + num_revived + num_copies > self.pool.num_free_blocks:
            return None
        return num_new_blocks

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        computed_blocks: Sequence[KVCacheBlock] = (),
        num_lookahead_tokens: int = 0,
        num_tokens_to_cache: int | None = None,
    ) -> list[KVCacheBlock] | None:
        """Make room for num_new_tokens after the computed ones (and any prefix hits given).

        Returns the newly taken blocks, or None (and changes nothing) if the pool is short.
        Full blocks whose tokens are known are registered for prefix caching."""
        rid = request.request_id
        limit = self.req_fast_limit.get(rid)
        if limit is not None and not computed_blocks and not num_lookahead_tokens and num_tokens_to_cache is None:
            end = request.num_computed_tokens + num_new_tokens
            if end <= limit:
                return []  # the common decode step: nothing to take, nothing to hash
            blocks = self.req_blocks[rid]
            if self.enable_prefix_caching and end <= len(blocks) * self.block_size:
                # a block fills up while the held blocks still have room: only register its hash
                self._cache_full_blocks(request, blocks, min(end, len(request.all_token_ids)))
                self._set_fast_limit(rid, blocks)
                return []
        num_new_blocks = self.can_allocate(request, num_new_tokens, computed_blocks, num_lookahead_tokens)
        if num_new_blocks is None:
            return None
        blocks = self.req_blocks.setdefault(rid, [])
        num_held = len(blocks)
        if computed_blocks:
            self.pool.touch(computed_blocks)
            blocks.extend(computed_blocks)
        if rid in self.req_may_share:
            self._copy_on_write(request, blocks)
        new_blocks = self.pool.get_new_blocks(num_new_blocks) if num_new_blocks else []
        blocks.extend(new_blocks)
        if len(blocks) != num_held:
            self._count_held(request, num_held, len(blocks))
            self._changed(rid, num_held)
        if self.enable_prefix_caching:
            end = request.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens
            self._cache_full_blocks(
                request, blocks, min(end, request.num_tokens) if num_tokens_to_cache is None else num_tokens_to_cache
            )
        self._set_fast_limit(rid, blocks)
        return new_blocks

    def decode_slot(self, request: Request) -> int:
        """allocate_slots(request, 1) for a decoding request past its fast limit, whose new block, if it
        needs one, is known to be free (a simulated decode run plans that: testbed.sim.decode_runs): the
        same block taken, hashes registered, counters and fast limit, without the general path's checks.
        Not for a request that may share a block (a fork) or that holds no blocks yet. Returns the number
        of blocks taken."""
        rid, bs = request.request_id, self.block_size
        blocks = self.req_blocks[rid]
        end = request.num_computed_tokens + 1
        held = len(blocks)
        taken = 0
        if end > held * bs:
            taken = self.blocks_needed(end) - held
            blocks.extend(self.pool.get_new_blocks(taken))
            self._count_held(request, held, len(blocks))
            self._changed(rid, held)
        if self.enable_prefix_caching:
            self._cache_full_blocks(request, blocks, min(end, len(request.all_token_ids)))
        self._set_fast_limit(rid, blocks)
        return taken

    def plan_decode(self, requests: list[Request], first_ends: list[int], steps: int):
        return decode_run_slots.plan_decode(self, requests, first_ends, steps)

    def decode_slots(self, requests, first_ends, takes, registers, per_step):
        return decode_run_slots.decode_slots(self, requests, first_ends, takes, registers, per_step)

    def slot_limits(self) -> dict[str, int]:
        return self.req_fast_limit

    def _shared_writes(self, request: Request, blocks) -> list[int]:
        """Positions of the held blocks the request's next tokens go into that someone else also holds."""
        first = request.num_computed_tokens // self.block_size
        return [i for i in range(first, len(blocks)) if blocks[i].ref_cnt > 1]

    def _copy_on_write(self, request: Request, blocks: list[KVCacheBlock]) -> None:
        """Swap each shared block the request is about to write for a private copy (the copy is logged for the
        executor, which runs it before the forward that writes). After this the request's writable blocks
        are all its own: later writes only go further."""
        rid = request.request_id
        for i in self._shared_writes(request, blocks):
            shared, (private,) = blocks[i], self.pool.get_new_blocks(1)
            self.record_copy([shared.block_id], [private.block_id], CopyKind.ON_DEVICE)
            self.pool.free_blocks([shared])  # the other holders keep it
            blocks[i] = private
            self._changed(rid, i)
            self.num_cow_copies += 1
        self.req_may_share.discard(rid)

    def fork(self, parent: Request, child: Request, num_tokens: int) -> None:
        """child (holding nothing) takes a reference on the parent's blocks holding its first num_tokens tokens:
        a parallel-sampling group's prompt. The last of them may be partly filled; whichever of the two writes
        into it while it is shared copies it first (allocate_slots)."""
        pid, cid, bs = parent.request_id, child.request_id, self.block_size
        shared = self.req_blocks[pid][: self.blocks_needed(num_tokens)]
        self.pool.share(shared)
        self.req_blocks[cid] = list(shared)
        self._count_held(child, 0, len(shared))
        self._changed(cid, 0)  # even with nothing shared (a 1-token prompt): the executor gets its row now
        # the same tokens, so the same chained hashes; full blocks the parent registered stay registered
        child.block_hashes = parent.block_hashes[: num_tokens // bs]
        self.req_num_hashed[cid] = min(self.req_num_hashed.get(pid, 0), num_tokens // bs)
        self.req_fast_limit.pop(pid, None)  # its next write may be into a shared block: the full path
        self.req_may_share.update((pid, cid))

    def _set_fast_limit(self, rid: str, blocks: list[KVCacheBlock]) -> None:
        """Up to this many tokens, a later allocate_slots(request, n) would take no block and register no
        hash: the held slots, short of the token that fills the next unregistered block. (It may also
        have nothing to do beyond it, e.g. with drafts past the known tokens; the full path sorts that out.)"""
        limit = len(blocks) * self.block_size
        if self.enable_prefix_caching:
            limit = min(limit, (self.req_num_hashed.get(rid, 0) + 1) * self.block_size - 1)
        self.req_fast_limit[rid] = limit

    def _count_held(self, request: Request, old: int, new: int) -> None:
        """A request's held blocks went from old to new: update the O(1) accounting counters."""
        bs, final = self.block_size, request.max_num_tokens
        self.num_held_blocks_total += new - old
        self.num_internal_slots += max(0, new * bs - final) - max(0, old * bs - final)

    def _cache_full_blocks(self, request: Request, blocks: list[KVCacheBlock], num_tokens: int) -> None:
        rid = request.request_id
        num_full = min(num_tokens // self.block_size, len(blocks))
        start = self.req_num_hashed.get(rid, 0)
        if num_full <= start:
            return
        self._update_hashes(request, num_full * self.block_size)
        extra = request.sampling_params.extra_args
        label = extra.get("request_class") if extra else None  # workload-aware eviction's request class
        self.pool.cache_blocks(blocks, request.block_hashes, start, num_full, label)
        self.req_num_hashed[rid] = num_full

    def free(self, request: Request) -> None:
        """Release a request's blocks, tail first so its shared prefix is the last to be evicted."""
        blocks = self.req_blocks.pop(request.request_id, [])
        self.req_num_hashed.pop(request.request_id, None)
        self.req_fast_limit.pop(request.request_id, None)
        self.req_may_share.discard(request.request_id)
        self._count_held(request, len(blocks), 0)
        self._block_changes.pop(request.request_id, None)
        self.pool.free_blocks(reversed(blocks))
        if self.host_tier is not None:
            self.host_tier.on_release(blocks)

    def trim(self, request: Request, num_tokens: int) -> None:
        """Give back blocks beyond what num_tokens needs (after rejected speculative tokens)."""
        blocks = self.req_blocks.get(request.request_id, [])
        self.req_fast_limit.pop(request.request_id, None)  # the next allocation takes the full path
        keep = self.blocks_needed(num_tokens)
        if len(blocks) > keep:
            surplus = blocks[keep:]
            del blocks[keep:]
            self._count_held(request, keep + len(surplus), keep)
            self._changed(request.request_id, keep)
            for block in surplus:
                if block.ref_cnt == 1:
                    self.pool.uncache_block(block)
            self.pool.free_blocks(reversed(surplus))
        num_full = num_tokens // self.block_size
        if self.req_num_hashed.get(request.request_id, 0) > num_full:
            self.req_num_hashed[request.request_id] = num_full

    def uncache_from(self, request: Request, num_tokens: int) -> None:
        for block in self.req_blocks.get(request.request_id, ())[num_tokens // self.block_size :]:
            self.pool.uncache_block(block)

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(request_id, ())]

    def running_stats(self, running, num_computed_tokens, max_model_len, blocked) -> KVCacheStats:
        return self.stats_from_counters(num_computed_tokens)

    def stats_from_counters(self, num_computed_tokens: int) -> KVCacheStats:
        """`stats()` for the engine's running requests in O(1), from counters kept as blocks change hands.

        num_computed_tokens: the running requests' computed tokens, summed. Equal to
        stats({rid: computed}, {rid: final_length}, blocked) when the requests holding blocks are exactly the
        running ones, each with slots for its computed tokens and never past its final length
        (`Request.max_num_tokens`, as capped by the scheduler): what the engine guarantees between steps,
        checked against the full accounting every step in tests/test_host_fast_paths.py. Then the empty
        slots a request holds are held - computed, and those beyond its final length, max(0, held - final),
        change only when its blocks do. Any free block serves any request: no external fragmentation."""
        return KVCacheStats(*self.compact_stats(num_computed_tokens))

    def compact_stats(self, num_computed_tokens: int) -> tuple[int, ...]:
        """stats_from_counters' fields as a tuple, in KVCacheStats' order (testbed.step_stats.kv_compact)."""
        bs, num_blocks = self.block_size, self.num_blocks
        free = self.pool.num_free_blocks
        used_blocks = num_blocks - free
        used, slack = used_blocks * bs, self.num_held_blocks_total * bs - num_computed_tokens
        internal = self.num_internal_slots
        # token slots: used slots less the empty held ones (slack)
        return (
            num_blocks,
            bs,
            used_blocks,
            used - slack,
            slack,
            self.pool.num_cached_free,
            free,
            used - slack,
            slack - internal,
            internal,
            0,
            free * bs,
        )

    def counters(self) -> tuple[int, int, int, int]:
        """What compact_stats reads of the cache: (free blocks, cached free blocks, held blocks summed over
        holders, internal slots)."""
        return self.pool.num_free_blocks, self.pool.num_cached_free, self.num_held_blocks_total, self.num_internal_slots

    def counter_spans(self, per_step: int) -> CounterSpans:
        """An empty record of compact_stats over consecutive steps, from counters() read where they change
        and computed tokens growing by per_step each step: what a simulated decode run notes of its
        steps (testbed.sim.decode_runs)."""
        return CounterSpans(self.num_blocks, self.block_size, per_step)
