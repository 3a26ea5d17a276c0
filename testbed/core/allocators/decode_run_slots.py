"""A planned decode run's allocations (the simulator's step skipping, testbed.sim.decode_runs): where in the run
each request needs a new block, and all of them taken at once. Functions of a PagedAllocator (its methods of
the same names call them), kept apart from its per-step paths; the real engine never calls them."""

from bisect import bisect_left
from typing import TYPE_CHECKING

from testbed.request import Request

if TYPE_CHECKING:
    from testbed.core.allocators.paged import PagedAllocator


def plan_decode(
    alloc: "PagedAllocator", requests: list[Request], first_ends: list[int], steps: int
) -> tuple[int, list[int], list[int]] | None:
    """Where decode_slot would act in a simulated decode run (testbed.sim.decode_runs) of up to `steps`
    steps: requests[i] decodes one token a step, its end (tokens with slots after the step's
    allocation) first_ends[i] + j at step j, and allocate_slots is called for it where that passes its
    fast limit. Returns (the steps whose new blocks the free ones cover: the run stops before the
    first that would need more, as nothing is freed during it; the keys j * len(requests) + i of the
    allocations that take a block; those that register full blocks), keys sorted, or None where the
    fast path does not decide (no fast limit, a request held elsewhere, two blocks in one step).
    After a request's last held block is full and registered, its events repeat every block_size
    steps (a block taken the step after, registered block_size steps after): ranges, not a loop."""
    bs, caching, n = alloc.block_size, alloc.enable_prefix_caching, len(requests)
    limits, req_blocks, req_hashed = alloc.req_fast_limit, alloc.req_blocks, alloc.req_num_hashed
    end_key = steps * n
    takes: list[int] = []
    registers: list[int] = []
    for i, (request, first) in enumerate(zip(requests, first_ends)):
        rid = request.request_id
        limit = limits.get(rid)
        held = len(req_blocks.get(rid, ()))
        if limit is None or (held + 1) * bs < first:  # the full path decides / two blocks in one step
            return None
        full = req_hashed.get(rid, 0) if caching else held
        j = max(limit - first + 1, 0)
        while full < held and j < steps:  # until its last held block is full and registered
            end = first + j
            if end > held * bs:
                held += 1
                takes.append(j * n + i)
            if min(end // bs, held) > full:
                full = min(end // bs, held)
                registers.append(j * n + i)
            j = min(held * bs, (full + 1) * bs - 1) - first + 1
        if full < held:  # still not, `steps` in
            continue
        # then the next block is taken at end held * bs + 1, registered at (held + 1) * bs, and so on
        last = held * bs - first  # the step after whose allocation its held blocks are all full
        if last < -1:
            return None  # tokens computed without slots: not a decoding request
        takes += range((last + 1) * n + i, end_key, bs * n)
        if caching:
            registers += range((last + bs) * n + i, end_key, bs * n)
    takes.sort()
    registers.sort()
    free = alloc.pool.num_free_blocks
    if len(takes) > free:
        steps = takes[free] // n
        takes = takes[: bisect_left(takes, steps * n)]
        registers = registers[: bisect_left(registers, steps * n)]
    return steps, takes, registers


def decode_slots(
    alloc: "PagedAllocator",
    requests: list[Request],
    first_ends: list[int],
    takes: list[int],
    registers: list[int],
    per_step: int,
) -> list:
    """The allocations plan_decode found for a run (its keys step * per_step + i, sorted, cut to the run's
    steps; requests[i]'s tokens known to its end at the last), as decode_slot makes them at each key
    in order. With the plain LRU queue at once: nothing else is freed or taken meanwhile, so the
    blocks taken are the queue's first ones, handed out in key order; then the hashes registered (the
    hash map ends the same: an eviction of a cached free block and a registration of a held one
    commute), the access log in the same order. Leaves num_computed_tokens to the caller. Returns
    (step, counters()) after each step that took a block, in step order."""
    pool, bs = alloc.pool, alloc.block_size
    noted: list = []
    if not pool.plain_lru:  # one at a time
        for key in sorted(set(takes).union(registers)):
            j, i = divmod(key, per_step)
            request = requests[i]
            request.num_computed_tokens = first_ends[i] - 1 + j
            if alloc.decode_slot(request):
                if noted and noted[-1][0] == j:
                    noted.pop()
                noted.append((j, alloc.counters()))
        return noted
    rids = [r.request_id for r in requests]
    lists = [alloc.req_blocks[rid] for rid in rids]
    first_held = [len(blocks) for blocks in lists]
    touched = set()
    if takes:
        free, cached, held_total, internal = alloc.counters()
        if len(takes) > free:
            raise ValueError(f"decode_slots: {len(takes)} blocks to take, {free} free")
        finals = [r.max_num_tokens for r in requests]
        evicts = pool.head_cached(len(takes))
        prev = -1  # the step of the last block taken: the counters are noted when the step changes
        for key, block, evicted in zip(takes, pool.get_new_blocks(len(takes)), evicts):
            j, i = divmod(key, per_step)
            if j != prev:
                if prev >= 0:
                    noted.append((prev, (free, cached, held_total, internal)))
                prev = j
            blocks = lists[i]
            h = len(blocks)
            if h == first_held[i]:  # its first new block: reported as decode_slot reports it
                alloc._changed(rids[i], h)
                touched.add(i)
            blocks.append(block)
            beyond = (h + 1) * bs - finals[i]  # slots past its final length (_count_held's internal)
            if beyond > 0:
                internal += beyond if beyond < bs else bs
            free -= 1
            cached -= evicted
            held_total += 1
        noted.append((prev, (free, cached, held_total, internal)))
        alloc.num_held_blocks_total, alloc.num_internal_slots = held_total, internal
    if registers and alloc.enable_prefix_caching:
        req_hashed = alloc.req_num_hashed
        hashed = [req_hashed.get(rid, 0) for rid in rids]  # full blocks registered so far, per request
        ranges: list[tuple[int, int, int]] = []
        for key in registers:
            j, i = divmod(key, per_step)
            start, full = hashed[i], (first_ends[i] + j) // bs  # the blocks held then cover its end
            if full <= start:
                raise ValueError(f"decode_slots: {rids[i]} has nothing to register at step {j}")
            hashed[i] = full
            ranges.append((i, start, full))
        labels = {}
        for i in {i for i, _, _ in ranges}:
            request = requests[i]
            alloc._update_hashes(request, hashed[i] * bs)
            req_hashed[rids[i]] = hashed[i]
            touched.add(i)
            extra = request.sampling_params.extra_args
            labels[i] = extra.get("request_class") if extra else None  # as _cache_full_blocks
        pool.cache_ranges([(lists[i], requests[i].block_hashes, a, b, labels[i]) for i, a, b in ranges])
    for i in touched:
        alloc._set_fast_limit(rids[i], lists[i])
    return noted
