"""A planned decode run's allocations (the simulator's step skipping, testbed.sim.decode_runs): where in the run
each request needs a new block, and all of them taken at once. Functions of a PagedAllocator (its methods of
the same names call them), kept apart from its per-step paths; the real engine never calls them."""

from bisect import bisect_left
from typing import TYPE_CHECKING

from testbed.core.allocators.block_hash import ROOT_HASH, hash_block
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
        if full == held - 1 and limit == held * bs - 1 and first <= held * bs and caching:
            # the usual state: its last held block fills at step j (registered), the next block is taken
            # the step after; what the loop below finds, at once
            j = limit - first + 1
            registers += range(j * n + i, end_key, bs * n)
            takes += range((j + 1) * n + i, end_key, bs * n)
            continue
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
    req_blocks, enable = alloc.req_blocks, alloc.enable_prefix_caching
    touched: dict[int, list] = {}  # position -> block list, of the requests whose blocks or hashes changed
    if takes:
        free, cached, held_total, internal = alloc.counters()
        if len(takes) > free:
            raise ValueError(f"decode_slots: {len(takes)} blocks to take, {free} free")
        evicts = pool.head_cached(len(takes))
        prev = -1  # the step of the last block taken: the counters are noted when the step changes
        for key, block, evicted in zip(takes, pool.get_new_blocks(len(takes)), evicts):
            j, i = divmod(key, per_step)
            if j != prev:
                if prev >= 0:
                    noted.append((prev, (free, cached, held_total, internal)))
                prev = j
            request = requests[i]
            blocks = touched.get(i)
            if blocks is None:  # its first new block: reported as decode_slot reports it
                blocks = touched[i] = req_blocks[request.request_id]
                alloc._changed(request.request_id, len(blocks))
            h = len(blocks)
            blocks.append(block)
            beyond = (h + 1) * bs - request.max_num_tokens  # slots past its final length (_count_held's internal)
            if beyond > 0:
                internal += beyond if beyond < bs else bs
            free -= 1
            cached -= evicted
            held_total += 1
        noted.append((prev, (free, cached, held_total, internal)))
        alloc.num_held_blocks_total, alloc.num_internal_slots = held_total, internal
    if registers and enable:
        _register(alloc, requests, first_ends, registers, per_step, touched)
    for i, blocks in touched.items():
        alloc._set_fast_limit(requests[i].request_id, blocks)
    return noted


def _register(
    alloc: "PagedAllocator",
    requests: list[Request],
    first_ends: list[int],
    registers: list[int],
    per_step: int,
    touched: dict[int, list],
) -> None:
    """decode_slots' registrations, key by key: the blocks each fills hashed (as _update_hashes chains
    them) and registered (as BlockPool.cache_ranges: skipping a block that has a hash, a duplicate kept
    after the first), the access log written once. The same hashes, map, duplicates and log, in the same
    order, as hashing each request's blocks first and registering them after."""
    pool, bs = alloc.pool, alloc.block_size
    req_hashed, req_blocks = alloc.req_num_hashed, alloc.req_blocks
    hash_to_block, duplicates, caching = pool.hash_to_block, pool.duplicates, pool.enable_caching
    logged: list[int] = []
    progress: dict[int, list] = {}  # position -> [full blocks registered, request, block list, label]
    for key in registers:
        j, i = divmod(key, per_step)
        state = progress.get(i)
        if state is None:
            request = requests[i]
            extra = request.sampling_params.extra_args
            label = extra.get("request_class") if extra else None  # as _cache_full_blocks
            rid = request.request_id
            state = progress[i] = [req_hashed.get(rid, 0), request, req_blocks[rid], label]
        start, request, blocks, label = state
        full = (first_ends[i] + j) // bs  # the blocks held then cover its end
        if full <= start:
            raise ValueError(f"decode_slots: {request.request_id} has nothing to register at step {j}")
        state[0] = full
        hashes = request.block_hashes
        have = len(hashes)
        if have < full:  # PagedAllocator._update_hashes(request, full * bs), inlined
            tokens = request.all_token_ids
            if len(tokens) < full * bs:
                raise ValueError(f"decode_slots: {request.request_id} has no tokens for block {full - 1}")
            parent = hashes[-1] if hashes else ROOT_HASH
            for b in range(have, full):
                parent = hash_block(parent, tokens[b * bs : b * bs + bs])
                hashes.append(parent)
        if not caching:
            continue
        for b in range(start, full):
            block = blocks[b]
            if block.block_hash is not None:
                continue
            block_hash = hashes[b]
            block.block_hash = block_hash
            block.depth = b
            block.request_class = label
            logged.append(block_hash)
            if hash_to_block.setdefault(block_hash, block) is not block:
                duplicates.setdefault(block_hash, []).append(block)
    for i, state in progress.items():
        req_hashed[state[1].request_id] = state[0]
        if i not in touched:
            touched[i] = state[2]
    if pool.access_log is not None and logged:
        pool.access_log.cache_all(logged)
