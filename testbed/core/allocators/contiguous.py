"""Static contiguous KV allocators: the Orca baselines of the vLLM paper (Kwon et al., SOSP 2023, Sec. 6.1
and Fig. 2).

At its first allocation a request reserves one contiguous run of blocks for its whole life, sized by
the variant, and keeps it until it finishes or is preempted:

    static_max         max_model_len tokens                                    (the paper's Orca (Max))
    static_pow2        prompt + the next power of two of its output length: the output is over-reserved
                       by less than 2x                                         (the paper's Orca (Pow2))
    static_oracle      exactly its final length, prompt + output               (the paper's Orca (Oracle))
    static_pow2_total  the next power of two of prompt + output (an earlier reading of "Pow2", kept as a
                       named variant: it over-reserves the prompt too)

Each is capped at max_model_len. Placement (testbed.core.allocators.placement) is first fit in address
order by default; the `*_buddy` variants place runs with a binary buddy system, as the paper assumes for
Orca, which rounds every run up to a power of two of blocks (the rounding is held beyond the final
length, so the accounting counts it as internal fragmentation). Holes between runs are real, so
external fragmentation is real. No prefix caching (nothing is shared), and a running request never
needs more memory, so it is never preempted for memory. With block_size=1 the reservation is exact to
the token; larger blocks round it up.
"""

from testbed.core.allocators.base import KVAllocator, final_length
from testbed.core.allocators.placement import PLACEMENTS, Buddy, FirstFit
from testbed.request import Request


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class _Unit:
    """One block of the contiguous pool, shaped like a KVCacheBlock for block-table builders."""

    __slots__ = ("block_id",)

    def __init__(self, block_id: int):
        self.block_id = block_id


class ContiguousAllocator(KVAllocator):
    name = "static"
    reserve = "max"  # max | pow2 | oracle | pow2_total
    placement = "first_fit"  # first_fit | buddy

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int, **_ignored):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.space: FirstFit | Buddy = PLACEMENTS[self.placement](num_blocks)
        self.runs: dict[str, tuple[int, int]] = {}  # request id -> (start, length)
        self._units = [_Unit(i) for i in range(num_blocks)]
        self.req_blocks: dict[str, list[_Unit]] = {}  # request id -> its run, as block objects
        self._ids: dict[str, list[int]] = {}
        self._init_counters()

    # ---- sizing -------------------------------------------------------------------------------------
    def reservation_tokens(self, prompt_len: int, final_len: int) -> int:
        """Token slots the variant reserves for a request of this prompt and final length."""
        if self.reserve == "max":
            tokens = self.max_model_len
        elif self.reserve == "pow2":
            tokens = prompt_len + next_pow2(final_len - prompt_len)
        elif self.reserve == "pow2_total":
            tokens = next_pow2(final_len)
        else:
            tokens = final_len
        return max(min(tokens, self.max_model_len), final_len)

    def _run_blocks(self, prompt_len: int, final_len: int) -> int:
        """Blocks the request's run takes: its reservation in blocks, as the placement hands them out."""
        return self.space.held_length(self.blocks_needed(self.reservation_tokens(prompt_len, final_len)))

    def blocks_for_request(self, final_len: int) -> int:
        """The most blocks any request of this final length can take (its prompt length unknown here:
        for static_pow2 the worst split, an output just past a power of two)."""
        if self.reserve != "pow2":
            return self._run_blocks(final_len, final_len)
        outputs = {final_len - 1} | {(1 << k) + 1 for k in range(final_len.bit_length()) if (1 << k) + 1 < final_len}
        return max(self._run_blocks(final_len - o, final_len) for o in outputs if o >= 1) if final_len > 1 else 1

    def _reservation(self, request: Request) -> int:
        return self._run_blocks(request.num_prompt_tokens, final_length(request, self.max_model_len))

    def contiguous_need(self, request: Request) -> int:
        return 0 if request.request_id in self.runs else self._reservation(request)

    # ---- allocation ---------------------------------------------------------------------------------
    def can_allocate(self, request, num_new_tokens, computed_blocks=(), num_lookahead_tokens=0):
        total = request.num_computed_tokens + num_new_tokens + num_lookahead_tokens
        run = self.runs.get(request.request_id)
        if run is not None:
            return 0 if self.blocks_needed(total) <= run[1] else None
        need = max(self._reservation(request), self.blocks_needed(total))
        return need if self.space.fits(need) else None

    def allocate_slots(
        self, request, num_new_tokens, computed_blocks=(), num_lookahead_tokens=0, num_tokens_to_cache=None
    ):
        need = self.can_allocate(request, num_new_tokens, computed_blocks, num_lookahead_tokens)
        if need is None:
            return None
        if request.request_id in self.runs:
            return []
        taken = self.space.take(need)
        assert taken is not None, "can_allocate said it fits"
        start, length = taken
        self.runs[request.request_id] = (start, length)
        self._ids[request.request_id] = ids = list(range(start, start + length))
        self.req_blocks[request.request_id] = self._units[start : start + length]
        self._changed(request.request_id, 0)
        return ids

    def free(self, request: Request) -> None:
        run = self.runs.pop(request.request_id, None)
        if run is None:
            return
        del self._ids[request.request_id]
        del self.req_blocks[request.request_id]
        self._block_changes.pop(request.request_id, None)
        self.space.give(*run)

    def get_block_ids(self, request_id: str) -> list[int]:
        return self._ids.get(request_id, [])

    # ---- accounting queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.space.num_free

    @property
    def holes(self) -> list[tuple[int, int]]:
        """Free pieces as (start, length), by address."""
        return self.space.free_spans()

    def num_held_blocks(self, request_id: str) -> int:
        run = self.runs.get(request_id)
        return run[1] if run else 0

    def free_runs(self) -> list[int]:
        return self.space.free_runs()

    def check_invariants(self) -> None:
        self.space.check_invariants()
        spans = sorted([(s, n, "hole") for s, n in self.holes] + [(s, n, r) for r, (s, n) in self.runs.items()])
        pos = 0
        for start, length, _ in spans:
            assert start == pos and length > 0, spans
            pos += length
        assert pos == self.num_blocks, spans


class StaticMaxAllocator(ContiguousAllocator):
    name, reserve = "static_max", "max"


class StaticPow2Allocator(ContiguousAllocator):
    name, reserve = "static_pow2", "pow2"


class StaticOracleAllocator(ContiguousAllocator):
    name, reserve = "static_oracle", "oracle"


class StaticPow2TotalAllocator(ContiguousAllocator):
    name, reserve = "static_pow2_total", "pow2_total"


class StaticMaxBuddyAllocator(ContiguousAllocator):
    name, reserve, placement = "static_max_buddy", "max", "buddy"


class StaticPow2BuddyAllocator(ContiguousAllocator):
    name, reserve, placement = "static_pow2_buddy", "pow2", "buddy"


class StaticOracleBuddyAllocator(ContiguousAllocator):
    name, reserve, placement = "static_oracle_buddy", "oracle", "buddy"
