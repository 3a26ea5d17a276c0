"""PagedAllocator.decode_slot (a simulated decode run's allocation, testbed.sim.decode_runs) leaves the
allocator exactly as allocate_slots(request, 1) does: the same blocks taken (evicting the same cached
ones), the same hashes registered, counters, fast limits, free queue and block-access stream."""

import random

import pytest

from testbed.core.allocators.paged import PagedAllocator
from testbed.request import Request
from testbed.sampling_params import SamplingParams


def state(kv: PagedAllocator) -> tuple:
    pool = kv.pool
    return (
        {rid: [b.block_id for b in blocks] for rid, blocks in kv.req_blocks.items()},
        dict(kv.req_num_hashed),
        dict(kv.req_fast_limit),
        [(b.block_id, b.block_hash, b.ref_cnt, b.depth, b.request_class) for b in pool.blocks],
        [b.block_id for b in pool.free_queue],
        {h: b.block_id for h, b in pool.hash_to_block.items()},
        {h: [b.block_id for b in bs] for h, bs in pool.duplicates.items()},
        (pool.num_cached_free, pool.num_evictions, kv.num_held_blocks_total, kv.num_internal_slots),
        kv.pool.access_log.columns(),
    )


def replay(block_size: int, caching: bool, use_decode_slot: bool, seed: int) -> tuple:
    """Requests sharing prefixes admitted, decoded token by token (past the fast limit: decode_slot or
    allocate_slots) and freed, in a cache small enough to evict."""
    rng = random.Random(seed)
    kv = PagedAllocator(40, block_size, caching)
    kv.start_access_log()
    prefixes = [[rng.randrange(50) for _ in range(12)] for _ in range(3)]
    running: list[Request] = []
    for n in range(60):
        if len(running) < 4:
            prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 10))]
            r = Request(f"r{n}", prompt, SamplingParams(max_tokens=40))
            blocks, hit = kv.get_computed_blocks(r)
            if kv.allocate_slots(r, len(prompt) - hit, blocks) is not None:
                r.num_computed_tokens = len(prompt)
                running.append(r)
        for r in list(running):
            r.all_token_ids.append(rng.randrange(50))  # the token sampled last step: its KV written now
            r.output_token_ids.append(r.all_token_ids[-1])
            r.num_computed_tokens = len(r.all_token_ids) - 1
            past_limit = len(r.all_token_ids) > kv.req_fast_limit[r.request_id]
            finishes = rng.random() < 0.1
            if past_limit and kv.num_free_blocks >= 1 and use_decode_slot:
                kv.decode_slot(r)
            elif kv.allocate_slots(r, 1) is None:
                finishes = True
            if finishes:
                kv.free(r)
                running.remove(r)
    return state(kv)


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decode_slot_equals_allocate_slots(block_size, caching, seed):
    stepped = replay(block_size, caching, False, seed)
    assert stepped == replay(block_size, caching, True, seed)
    assert stepped[7][1] > 0 or not caching or block_size == 16  # evictions happened (the check is not empty)


def decode_run(block_size: int, caching: bool, eviction: str, seed: int, planned: bool) -> tuple:
    """Requests that shared prefixes finished (their blocks cached free, decode blocks included), then a run
    of requests with the same prompts decoding the same token: their decode blocks get the hashes of cached
    free ones, which the run's new blocks evict. The run's allocations by decode_slot at each step past a
    fast limit while the free blocks last, or as plan_decode plans them and decode_slots makes them.
    Returns the state, the running requests' block hashes, the counters after each step that took a block,
    the evictions during the run, the allocation keys, the hashes registered that cached blocks had, and
    the steps run."""
    rng = random.Random(seed)
    kv = PagedAllocator(120 // block_size, block_size, caching, eviction)  # small enough to evict
    kv.start_access_log()
    prompts = [[rng.randrange(50) for _ in range(rng.randrange(3, 14))] for _ in range(3)]

    def admit(name: str, prompt: list[int], max_tokens: int = 30) -> Request:
        r = Request(name, prompt, SamplingParams(max_tokens=max_tokens, extra_args={"request_class": name[-1]}))
        blocks, hit = kv.get_computed_blocks(r)
        assert kv.allocate_slots(r, len(prompt) - hit, blocks) is not None
        r.num_computed_tokens = len(prompt)
        r.all_token_ids.append(7)  # its first token, sampled: decoding from here
        r.output_token_ids.append(7)
        return r

    for n, prompt in enumerate(prompts):  # decoded a while and finished
        r = admit(f"done{n}", prompt)
        for _ in range(rng.randrange(4, 20)):
            r.num_computed_tokens = len(r.all_token_ids)
            assert kv.allocate_slots(r, 1) is not None
            r.all_token_ids.append(7)
        kv.free(r)
    # their first token and the run's 24: the last blocks they take reach past their final length
    running = [admit(f"r{n}", rng.choice(prompts), max_tokens=25) for n in range(4)]
    base = [len(r.all_token_ids) for r in running]
    steps = 24
    for r in running:
        r.all_token_ids += [7] * steps
        r.output_token_ids += [7] * steps
    evictions, cached = kv.pool.num_evictions, set(kv.pool.hash_to_block)
    hashed = [len(r.block_hashes) for r in running]

    def collisions() -> int:  # hashes the run registered that a cached block had when it started
        return sum(h in cached for r, k in zip(running, hashed) for h in r.block_hashes[k:])

    if planned:
        plan = kv.plan_decode(running, base, steps)
        assert plan is not None
        fit, takes, registers = plan
        noted = kv.decode_slots(running, base, takes, registers, len(running))
        hashes, keys = [r.block_hashes for r in running], sorted({*takes, *registers})
        return state(kv), hashes, noted, kv.pool.num_evictions - evictions, keys, collisions(), fit
    keys, noted = [], []
    for j in range(steps + 1):  # where stepping calls allocate_slots (past the fast limit), while blocks last
        due = [i for i, r in enumerate(running) if base[i] + j > kv.req_fast_limit[r.request_id]]
        new = sum(base[i] + j > kv.num_held_blocks(running[i].request_id) * block_size for i in due)
        if j == steps or new > kv.num_free_blocks:
            break
        keys += [j * len(running) + i for i in due]
        for i in due:
            running[i].num_computed_tokens = base[i] - 1 + j
            kv.decode_slot(running[i])
        if new:
            noted.append((j, kv.counters()))
    return state(kv), [r.block_hashes for r in running], noted, kv.pool.num_evictions - evictions, keys, collisions(), j


@pytest.mark.parametrize("block_size", [1, 2, 4])
@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("eviction", ["lru", "lfu"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decode_slots_equal_decode_slot_each(block_size, caching, eviction, seed):
    """PagedAllocator.plan_decode finds where a decode run's allocations fall and where the free blocks
    run out, as stepping finds them; decode_slots (all at once with the LRU queue, one at a time with
    another) leaves the allocator as decode_slot at each of them in step and batch order, and notes the
    counters after each step that took a block."""
    each = decode_run(block_size, caching, eviction, seed, planned=False)
    assert decode_run(block_size, caching, eviction, seed, planned=True) == each
    _, _, noted, evicted, keys, collided, ran = each
    assert noted and len(keys) > len(noted)  # blocks taken, hashes registered
    assert ran < 24 or seed != 0  # seed 0: the free blocks run out mid-run
    assert (evicted > 0 and collided > 0) or not caching  # cached free blocks evicted, their hashes registered
