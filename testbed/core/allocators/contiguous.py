"""Static contiguous KV allocators: the Orca-style baselines of the vLLM paper (Fig. 2).

At its first allocation a request reserves one contiguous run of blocks for its whole life, sized by
the variant, placed first-fit in address order, and keeps it until it finishes or is preempted:

    static_max     max_model_len tokens
    static_pow2    the next power of two of its final length (capped at max_model_len)
    static_oracle  exactly its final length

Holes between runs are real, so external fragmentation is real. No prefix caching (nothing is
shared), and a running request never needs more memory, so it is never preempted for memory.
With block_size=1 the reservation is exact to the token; larger blocks round it up.
"""

import bisect

from testbed.core.allocators.base import KVAllocator, final_length
from testbed.request import Request


class _Unit:
    """One block of the contiguous pool, shaped like a KVCacheBlock for block-table builders."""

    __slots__ = ("block_id",)

    def __init__(self, block_id: int):
        self.block_id = block_id


class ContiguousAllocator(KVAllocator):
    name = "static"
    reserve = "max"

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int, **_ignored):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.holes: list[list[int]] = [[0, num_blocks]]  # [start, length], sorted by start, coalesced
        self.runs: dict[str, tuple[int, int]] = {}  # request id -> (start, length)
        self._units = [_Unit(i) for i in range(num_blocks)]
        self.req_blocks: dict[str, list[_Unit]] = {}  # request id -> its run, as block objects
        self._ids: dict[str, list[int]] = {}
        self._num_free = num_blocks
        self._init_counters()

    # ---- sizing -------------------------------------------------------------------------------------
    def reservation_tokens(self, final_len: int) -> int:
        if self.reserve == "max":
            return self.max_model_len
        if self.reserve == "pow2":
            return min(1 << max(final_len - 1, 0).bit_length(), self.max_model_len)
        return final_len

    def blocks_for_request(self, final_len: int) -> int:
        return self.blocks_needed(max(self.reservation_tokens(final_len), final_len))

    def _reservation(self, request: Request) -> int:
        return self.blocks_for_request(final_length(request, self.max_model_len))

    def contiguous_need(self, request: Request) -> int:
        return 0 if request.request_id in self.runs else self._reservation(request)

    # ---- allocation ---------------------------------------------------------------------------------
    def can_allocate(self, request, num_new_tokens, computed_blocks=(), num_lookahead_tokens=0):
        total = request.num_computed_tokens + num_new_tokens + num_lookahead_tokens
        run = self.runs.get(request.request_id)
        if run is not None:
            return 0 if self.blocks_needed(total) <= run[1] else None
        need = max(self._reservation(request), self.blocks_needed(total))
        return need if self._first_fit(need) is not None else None

    def _first_fit(self, need: int) -> int | None:
        for i, (_, length) in enumerate(self.holes):
            if length >= need:
                return i
        return None

    def allocate_slots(
        self, request, num_new_tokens, computed_blocks=(), num_lookahead_tokens=0, num_tokens_to_cache=None
    ):
        need = self.can_allocate(request, num_new_tokens, computed_blocks, num_lookahead_tokens)
        if need is None:
            return None
        if request.request_id in self.runs:
            return []
        i = self._first_fit(need)
        start = self.holes[i][0]
        if self.holes[i][1] == need:
            del self.holes[i]
        else:
            self.holes[i][0] += need
            self.holes[i][1] -= need
        self.runs[request.request_id] = (start, need)
        self._ids[request.request_id] = ids = list(range(start, start + need))
        self.req_blocks[request.request_id] = self._units[start : start + need]
        self._changed(request.request_id, 0)
        self._num_free -= need
        return ids

    def free(self, request: Request) -> None:
        run = self.runs.pop(request.request_id, None)
        if run is None:
            return
        del self._ids[request.request_id]
        del self.req_blocks[request.request_id]
        self._block_changes.pop(request.request_id, None)
        start, length = run
        self._num_free += length
        i = bisect.bisect_left(self.holes, [start, 0])
        self.holes.insert(i, [start, length])
        if i + 1 < len(self.holes) and start + length == self.holes[i + 1][0]:  # merge right
            self.holes[i][1] += self.holes.pop(i + 1)[1]
        if i > 0 and self.holes[i - 1][0] + self.holes[i - 1][1] == start:  # merge left
            self.holes[i - 1][1] += self.holes.pop(i)[1]

    def get_block_ids(self, request_id: str) -> list[int]:
        return self._ids.get(request_id, [])

    # ---- accounting queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    def num_held_blocks(self, request_id: str) -> int:
        run = self.runs.get(request_id)
        return run[1] if run else 0

    def free_runs(self) -> list[int]:
        return [length for _, length in self.holes]

    def check_invariants(self) -> None:
        spans = sorted([(s, n, "hole") for s, n in self.holes] + [(s, n, r) for r, (s, n) in self.runs.items()])
        pos = 0
        for start, length, _ in spans:
            assert start == pos and length > 0, spans
            pos += length
        assert pos == self.num_blocks, spans
        assert all(a[0] + a[1] < b[0] for a, b in zip(self.holes, self.holes[1:])), self.holes
        assert self._num_free == sum(n for _, n in self.holes)


class StaticMaxAllocator(ContiguousAllocator):
    name, reserve = "static_max", "max"


class StaticPow2Allocator(ContiguousAllocator):
    name, reserve = "static_pow2", "pow2"


class StaticOracleAllocator(ContiguousAllocator):
    name, reserve = "static_oracle", "oracle"
