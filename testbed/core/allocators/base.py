"""The KV-allocator interface and the one place that accounts for KV memory (the fragmentation study).

Every allocator (paged, static contiguous) hands out *units* of `block_size` token slots and answers
the same few questions; `KVAllocator.stats` turns those answers into the memory breakdown, so the
numbers mean the same thing for every allocator:

    token_slots     hold a computed token state
    reserved_slots  held by a request for its own future tokens (up to its final length)
    internal_slots  held by a request but never to be filled (beyond its final length)
    external_slots  free, but in holes too small for the request that is blocked waiting for memory
    free_slots      free and usable (idle capacity, including evictable prefix-cache blocks)

They partition the cache: the five sum to num_blocks * block_size.
"""

import enum
from dataclasses import dataclass
from typing import Any

from testbed.request import Request


class CopyKind(enum.Enum):
    TO_HOST = "to_host"  # swap-out: device blocks -> the host pool
    TO_DEVICE = "to_device"  # swap-in: host pool -> device blocks
    ON_DEVICE = "on_device"  # copy on write: a shared device block -> a private one (parallel sampling)


# (source block ids, destination block ids, kind): run by the executor in the order made, before its forward
KVCopy = tuple[list[int], list[int], CopyKind]


def final_length(request: Request, max_model_len: int) -> int:
    """Prompt + output length a request will reach at most (exact for traces, which ignore EOS)."""
    max_tokens = request.sampling_params.max_tokens
    total = request.num_prompt_tokens + (max_tokens if max_tokens is not None else max_model_len)
    return min(total, max_model_len)


@dataclass
class KVCacheStats:
    """A snapshot of the cache, in token slots (block_size slots per block)."""

    num_blocks: int
    block_size: int
    used_blocks: int  # held by at least one request
    used_token_slots: int  # slots holding a token state
    slack_token_slots: int  # empty slots in blocks held by running requests (reserved + internal)
    cached_free_blocks: int  # free, but still holding a hittable prefix
    free_blocks: int
    # the memory breakdown (see the module docstring); these five sum to total_slots
    token_slots: int = 0
    reserved_slots: int = 0
    internal_slots: int = 0
    external_slots: int = 0
    free_slots: int = 0

    @property
    def usage(self) -> float:
        return self.used_blocks / self.num_blocks

    @property
    def total_slots(self) -> int:
        return self.num_blocks * self.block_size

    def shares(self) -> dict[str, float]:
        """Fractions of the whole cache: token / reserved / internal / external / free."""
        total = self.total_slots
        return {
            "token": self.token_slots / total,
            "reserved": self.reserved_slots / total,
            "internal": self.internal_slots / total,
            "external": self.external_slots / total,
            "free": self.free_slots / total,
        }


class KVAllocator:
    """What the scheduler needs from a KV-memory allocator.

    Subclasses implement the allocation calls; the accounting (`stats`), the prefix-cache counters and
    the block-table change reports live here, shared by all. Subclasses keep `req_blocks`: request id ->
    the list of its blocks (objects with a `block_id`), and call `_changed(rid, first)` whenever that list
    changes from position `first` on (blocks taken or trimmed), and drop the report when they free it.

    The executor never reads an allocator: `take_block_updates` drains the reports into the
    SchedulerOutput, which carries them forward (vLLM v1 pushes new block ids the same way). Block copies
    (swap's, copy on write) are logged in the order made (`record_copy`) and drained the same way
    (`take_copies`): one ordered list, because a block freed by one copy's source may be the next one's
    destination within a step."""

    name = "base"
    block_size: int
    num_blocks: int
    req_blocks: dict[str, list]
    enable_prefix_caching = False
    supports_fork = False  # shares blocks between a parallel-sampling group's sequences (fork)
    supports_host_tier = False  # keeps evicted prefix blocks in a host KV tier (testbed.core.host_tier)
    # a paged allocator's testbed.core.block_pool.BlockPool (its prefix cache, which a cluster's routers and
    # P/D hand-over read); None: the allocator has no block pool
    pool: Any = None

    def _init_counters(self) -> None:
        self.prefix_queries = 0  # prefix-cache counters, in tokens, over first schedulings
        self.prefix_hits = 0
        self._block_changes: dict[str, int] = {}  # request id -> first block position changed, not yet reported
        self._copies: list[KVCopy] = []  # not yet handed to the executor, in the order made

    # ---- block-table change reports -----------------------------------------------------------------
    def _changed(self, request_id: str, first: int) -> None:
        old = self._block_changes.get(request_id)
        if old is None or first < old:
            self._block_changes[request_id] = first

    def take_block_updates(self) -> dict[str, tuple[int, list[int]]]:
        """Every block list that changed since the last call: request id -> (first changed position, the
        block ids from there on). A freed request has no entry (its next allocation reports from 0)."""
        changes = self._block_changes
        if not changes:
            return {}
        self._block_changes = {}
        req_blocks = self.req_blocks
        return {rid: (first, [b.block_id for b in req_blocks[rid][first:]]) for rid, first in changes.items()}

    def drop_block_updates(self) -> None:
        """Forget the changes take_block_updates would report (a simulated decode run: nothing reads them)."""
        if self._block_changes:
            self._block_changes = {}

    # ---- block copies -------------------------------------------------------------------------------------
    def record_copy(self, src: list[int], dst: list[int], kind: CopyKind) -> None:
        self._copies.append((src, dst, kind))

    def take_copies(self) -> list[KVCopy]:
        copies, self._copies = self._copies, []
        return copies

    # ---- allocation (subclasses) ------------------------------------------------------------------
    def get_computed_blocks(self, request: Request):
        """Longest cached prefix of a request not yet holding blocks: (blocks, num computed tokens)."""
        return [], 0

    def can_allocate(
        self, request: Request, num_new_tokens: int, computed_blocks=(), num_lookahead_tokens: int = 0
    ) -> int | None:
        raise NotImplementedError

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        computed_blocks=(),
        num_lookahead_tokens: int = 0,
        num_tokens_to_cache: int | None = None,
    ):
        """Room for num_new_tokens after the computed ones; None (changing nothing) if it is not there."""
        raise NotImplementedError

    def slot_limits(self) -> dict[str, int]:
        """request id -> up to how many tokens (computed + new) `allocate_slots(request, n)` (no other
        arguments) would take nothing and change nothing: the scheduler skips the call below it. The
        allocator keeps the dict current; an id not in it always gets the call."""
        return {}

    def free(self, request: Request) -> None:
        raise NotImplementedError

    def trim(self, request: Request, num_tokens: int) -> None:
        """Give back room beyond num_tokens where the allocator can (rejected speculative tokens)."""

    def uncache_from(self, request: Request, num_tokens: int) -> None:
        """Take the request's blocks from the one holding token num_tokens on out of the prefix cache (their
        KV may never have been written: a failed step). Nothing to do without a prefix cache."""

    def fork(self, parent: Request, child: Request, num_tokens: int) -> None:
        """child shares the parent's blocks holding its first num_tokens tokens (allocators with supports_fork)."""
        raise NotImplementedError(f"cache={self.name} cannot share blocks between sequences")

    def get_block_ids(self, request_id: str) -> list[int]:
        raise NotImplementedError

    # ---- sizing and accounting queries (subclasses) -----------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        raise NotImplementedError

    def num_held_blocks(self, request_id: str) -> int:
        raise NotImplementedError

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_for_request(self, final_len: int) -> int:
        """Blocks a request reaching final_len tokens holds at most (to reject what can never fit)."""
        return self.blocks_needed(final_len)

    def contiguous_need(self, request: Request) -> int:
        """Blocks the request's next allocation needs in one contiguous piece (1: any free block will do)."""
        return 1

    def free_runs(self) -> list[int]:
        """Lengths, in blocks, of the maximal runs of free blocks with consecutive ids."""
        return []

    def num_cached_free_blocks(self) -> int:
        return 0

    def start_access_log(self):
        """Record the prefix cache's block-access stream (testbed.core.access_log) and return it; None: this
        allocator has no prefix cache to record."""
        return None

    def stop_access_log(self) -> None:
        """Stop recording the block-access stream (nothing to do without one)."""

    # ---- prefix-cache counters --------------------------------------------------------------------
    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int, request=None) -> None:
        self.prefix_queries += num_tokens
        self.prefix_hits += num_hit_tokens

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    # ---- the accounting -----------------------------------------------------------------------------
    def running_stats(
        self, running: list[Request], num_computed_tokens: int, max_model_len: int, blocked: Request | None
    ) -> KVCacheStats:
        """The breakdown after a step, for the scheduler's running requests (num_computed_tokens: theirs,
        summed; the paged allocator answers from its counters in O(1))."""
        return self.stats(
            {r.request_id: r.num_computed_tokens for r in running},
            {r.request_id: final_length(r, max_model_len) for r in running},
            blocked,
        )

    def stats(
        self, token_counts: dict[str, int], final_lens: dict[str, int] | None = None, blocked: Request | None = None
    ) -> KVCacheStats:
        """token_counts: request id -> token states it holds after this step; final_lens: request id ->
        the length it will reach (None: every empty held slot counts as reserved); blocked: the waiting
        request that could not get memory this step (None: nothing waits for memory).

        Only a request's tail blocks can be partly empty and those are never shared, so physical token
        slots are the used slots minus every request's empty held slots (shared prefix blocks count once).
        (One exception, for one step: a parallel-sampling fork's partly filled prompt block, shared until its
        holders copy it; its empty slots then count once per holder.)"""
        bs = self.block_size
        used_blocks = self.num_blocks - self.num_free_blocks
        slack = reserved = 0
        for rid, n in token_counts.items():
            held = self.num_held_blocks(rid) * bs
            if not held:
                continue
            n = min(n, held)
            slack += held - n
            final = None if final_lens is None else final_lens.get(rid)
            reserved += held - n if final is None else max(0, min(final, held) - n)
        external = 0
        if blocked is not None:
            need = self.contiguous_need(blocked)
            if need > 1:
                external = sum(run for run in self.free_runs() if run < need) * bs
        free_slots = self.num_free_blocks * bs
        token_slots = used_blocks * bs - slack
        return KVCacheStats(
            self.num_blocks,
            bs,
            used_blocks,
            token_slots,
            slack,
            self.num_cached_free_blocks(),
            self.num_free_blocks,
            token_slots,
            reserved,
            slack - reserved,
            external,
            free_slots - external,
        )
