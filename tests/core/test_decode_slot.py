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
        [(b.block_id, b.block_hash, b.ref_cnt, b.depth) for b in pool.blocks],
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


def test_compact_stats_spans_equal_each_step():
    """A decode run notes the cache's state for its steps at once from the counters it read where blocks
    were taken (compact_stats_spans): the same tuples as compact_stats at each step's computed tokens,
    with the counters of that step."""
    kv = PagedAllocator(20, 4, True)
    r = Request("r", list(range(10)), SamplingParams(max_tokens=5))
    kv.allocate_slots(r, 10)
    r.num_computed_tokens = 10
    before, stats_before = kv.counters(), [kv.compact_stats(7 + 3 * k) for k in range(6)]
    assert before == (17, 0, 3, 0)  # three blocks held: the counters are read, not assumed
    r.num_computed_tokens = 12
    kv.allocate_slots(r, 1)  # a fourth block
    after, stats_after = kv.counters(), [kv.compact_stats(7 + 3 * k) for k in range(6)]
    assert after == (16, 0, 4, 1)
    spans = [(2, before), (0, after), (3, after), (1, before)]
    expected = stats_before[:2] + stats_after[2:5] + stats_before[5:]
    assert kv.compact_stats_spans(7, 3, spans) == expected
    assert kv.compact_stats_spans(7, 0, [(2, after)]) == [kv.compact_stats(7)] * 2
    assert kv.compact_stats_spans(7, 3, []) == []
