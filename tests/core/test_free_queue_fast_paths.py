"""BlockPool's whole-queue paths for the LRU free queue (FreeBlockQueue.popleft_n in get_new_blocks, its
append inlined in free_blocks) leave the pool exactly as the one-block-at-a-time paths, which any other
queue takes (here a FreeBlockQueue subclass): the same blocks handed out, the same free-queue order, hash
map, duplicates, counters and block-access stream, also after a double free is refused mid-way."""

import random

import pytest

from testbed.core.access_log import KVAccessLog
from testbed.core.block_pool import BlockPool, FreeBlockQueue


class OneByOne(FreeBlockQueue):
    """The same queue, not the exact type: BlockPool takes its generic paths."""


def pool(generic: bool) -> BlockPool:
    p = BlockPool(40)
    if generic:
        p.free_queue = OneByOne(p.blocks)
    p.access_log = KVAccessLog()
    return p


def state(p: BlockPool) -> tuple:
    return (
        [b.block_id for b in p.free_queue],
        p.free_queue.num_free,
        {h: b.block_id for h, b in p.hash_to_block.items()},
        {h: [b.block_id for b in bs] for h, bs in p.duplicates.items()},
        [(b.ref_cnt, b.block_hash) for b in p.blocks],
        p.num_cached_free,
        p.num_evictions,
        p.access_log.events,
    )


def play(p: BlockPool, seed: int) -> list:
    rng = random.Random(seed)
    held: list = []
    taken = []
    for _ in range(300):
        if held and rng.random() < 0.45:
            blocks = held.pop(rng.randrange(len(held)))
            p.free_blocks(reversed(blocks))
        elif p.num_free_blocks:
            blocks = p.get_new_blocks(rng.randint(1, min(6, p.num_free_blocks)))
            taken.append([b.block_id for b in blocks])
            # a few hashes repeat: duplicates, and evictions of blocks whose hash another block holds
            hashes = [rng.randrange(30) for _ in blocks]
            p.cache_blocks(blocks, hashes, 0, rng.randint(0, len(blocks)), None)
            held.append(blocks)
        p.check_invariants()
    return taken


@pytest.mark.parametrize("seed", range(4))
def test_whole_queue_paths_equal_one_by_one(seed):
    fast, generic = pool(False), pool(True)
    assert play(fast, seed) == play(generic, seed)
    assert state(fast) == state(generic)
    assert fast.num_evictions > 0  # the check is not empty


def test_double_free_refused_mid_way_keeps_the_queue():
    states = []
    for generic in (False, True):
        p = pool(generic)
        a, b = p.get_new_blocks(3), p.get_new_blocks(2)
        p.free_blocks(b)
        with pytest.raises(AssertionError, match="double free"):
            p.free_blocks([a[0], b[1], a[2]])  # b[1] is free already: a[0] joins the queue, a[2] does not
        p.check_invariants()
        states.append(state(p))
    assert states[0] == states[1]
    assert states[0][0][-1] == a[0].block_id == 0  # in the queue, last
