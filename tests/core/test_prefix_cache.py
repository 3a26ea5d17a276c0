"""Prefix-cache accounting: a repeated prompt hits all its full blocks and computes only the rest."""

import pytest

from testbed import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny():
    return LLM(model="tiny", block_size=8, num_blocks=256)


def test_identical_prompt_hits_every_full_block(tiny):
    prompt = list(range(100, 137))  # 37 tokens: 4 full blocks of 8 + 5
    first = tiny.generate([prompt], GREEDY)[0]
    assert first.metrics.num_cached_tokens == 0
    engine = tiny.engine
    computed_before = engine.kv.prefix_queries
    second = tiny.generate([prompt], GREEDY)[0]
    assert second.metrics.num_cached_tokens == 32
    assert engine.kv.prefix_queries - computed_before == 37
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def test_block_aligned_prompt_leaves_one_token_to_compute(tiny):
    prompt = list(range(200, 232))  # exactly 4 blocks
    tiny.generate([prompt], GREEDY)
    again = tiny.generate([prompt], GREEDY)[0]
    assert again.metrics.num_cached_tokens == 24  # the last block is recomputed: its last token needs logits


def test_shared_prefix_then_divergence(tiny):
    base = list(range(300, 324))  # 3 full blocks
    tiny.generate([base + [5, 6, 7]], GREEDY)
    other = tiny.generate([base + [9, 9, 9, 9]], GREEDY)[0]
    assert other.metrics.num_cached_tokens == 24


def test_prefix_caching_off_never_hits():
    llm = LLM(model="tiny", block_size=8, num_blocks=64, enable_prefix_caching=False)
    prompt = list(range(100, 140))
    llm.generate([prompt], GREEDY)
    assert llm.generate([prompt], GREEDY)[0].metrics.num_cached_tokens == 0
    assert llm.engine.kv.pool.hash_to_block == {}


def test_evicted_prefix_is_recomputed():
    llm = LLM(model="tiny", block_size=4, num_blocks=12)
    a, b = list(range(100, 120)), list(range(500, 540))  # b needs 10+ blocks, evicting a's cached ones
    llm.generate([a], GREEDY)
    llm.generate([b], GREEDY)
    assert llm.generate([a], GREEDY)[0].metrics.num_cached_tokens < 16
    llm.engine.kv.pool.check_invariants()


def test_block_hashes_are_the_same_in_every_process():
    """Prefix-affinity routing and simulated cluster runs depend on block hashes: they must not change with
    the process (hash(None) is an address before Python 3.12; strings hash by PYTHONHASHSEED). One other
    process, with a hash seed other than this one's (each process imports torch: seconds)."""
    import os
    import subprocess
    import sys

    from testbed.core.allocators.paged import hash_block

    code = "from testbed.core.allocators.paged import hash_block; print(hash_block(hash_block(None, [1, 2]), [3]))"
    here = hash_block(hash_block(None, [1, 2]), [3])
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"  # unset here: a random seed
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout) == here


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_block_hashes_chain_hash_block(block_size):
    """A request's block hashes, grown in pieces as its tokens are (PagedAllocator._update_hashes), are
    hash_block chained over its full blocks; a partly filled last block has none."""
    import random

    from testbed.core.allocators.paged import PagedAllocator, hash_block
    from testbed.request import Request

    rng = random.Random(block_size)
    kv = PagedAllocator(8, block_size)
    tokens = [rng.randrange(1000) for _ in range(10 * block_size + block_size // 2)]
    r = Request("r", tokens, SamplingParams())
    for upto in (0, block_size - 1, 3 * block_size + 1, 3 * block_size + 1, len(tokens)):
        kv._update_hashes(r, upto)
        expected, parent = [], None
        for i in range(upto // block_size):
            parent = hash_block(parent, tokens[i * block_size : (i + 1) * block_size])
            expected.append(parent)
        assert r.block_hashes == expected
