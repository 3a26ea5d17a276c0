"""KV allocators (paged + static contiguous), the shared memory accounting, and prefix-cache eviction."""

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from testbed.core.allocators import ALLOCATORS, get_allocator
from testbed.core.allocators.base import final_length
from testbed.core.allocators.paged import PagedAllocator
from testbed.request import Request
from testbed.sampling_params import SamplingParams

from .helpers import Sim


def req(rid, prompt_len, max_tokens):
    return Request(rid, [100 + i for i in range(prompt_len)], SamplingParams(max_tokens=max_tokens))


def test_registry_and_reservation_sizes():
    assert set(ALLOCATORS) == {
        "paged",
        *(f"static_{v}" for v in ("max", "pow2", "oracle", "pow2_total")),
        *(f"static_{v}_buddy" for v in ("max", "pow2", "oracle")),
    }
    r = req("a", 100, 50)  # final length 150
    assert final_length(r, 1000) == 150 and final_length(req("b", 990, 50), 1000) == 1000
    sizes = {}
    for name in ALLOCATORS:
        if name == "paged":
            continue
        kv = get_allocator(name, 4096, 1, max_model_len=1000)
        assert kv.allocate_slots(r, 100) is not None
        sizes[name] = kv.num_held_blocks("a")
        assert kv.allocate_slots(r, 49) == []  # growth stays inside the reservation
    # Orca (Pow2) as in the vLLM paper: prompt + pow2(output) = 100 + 64; the buddy system rounds every
    # run up to a power of two of blocks
    assert sizes == {
        "static_max": 1000,
        "static_pow2": 164,
        "static_oracle": 150,
        "static_pow2_total": 256,
        "static_max_buddy": 1024,
        "static_pow2_buddy": 256,
        "static_oracle_buddy": 256,
    }
    kv = get_allocator("static_oracle", 4096, 16, max_model_len=1000)
    kv.allocate_slots(r, 100)
    assert kv.num_held_blocks("a") == 10  # rounded up to blocks of 16
    with pytest.raises(ValueError, match="unknown cache"):
        get_allocator("buddy", 4, 1, max_model_len=8)


def test_pow2_over_reserves_the_output_by_less_than_twice():
    """The paper's rule bounds the waste by the output length: reserved - final < output, for every split
    (the old pow2(prompt + output) rule wastes up to the whole prompt + output, e.g. 1,000 + 25 -> 2,048)."""
    kv = get_allocator("static_pow2", 8192, 1, max_model_len=4096)
    old = get_allocator("static_pow2_total", 8192, 1, max_model_len=4096)
    assert kv.reservation_tokens(1000, 1025) == 1032 and old.reservation_tokens(1000, 1025) == 2048
    for prompt in (1, 7, 100, 1000):
        for output in (1, 2, 3, 64, 65, 338, 1000):
            reserved = kv.reservation_tokens(prompt, prompt + output)
            assert prompt + output <= reserved < prompt + 2 * output or output == 1
            # a request of this final length never takes more than blocks_for_request says (validation)
            assert reserved <= kv.blocks_for_request(prompt + output)
    assert kv.reservation_tokens(4000, 4090) == 4096  # capped at max_model_len


def test_buddy_placement_splits_and_merges():
    kv = get_allocator("static_oracle_buddy", 16, 1, max_model_len=16)
    a, b, c = req("a", 2, 1), req("b", 4, 1), req("c", 2, 1)  # runs of 4, 8, 4
    for r in (a, b, c):
        kv.allocate_slots(r, r.num_prompt_tokens)
    assert [kv.runs[x.request_id] for x in (a, b, c)] == [(0, 4), (8, 8), (4, 4)]  # aligned to their size
    assert kv.num_free_blocks == 0
    kv.free(a)
    kv.free(b)  # [0, 4) and [8, 16) are free, but not buddies of one another: no run of 8 at 0
    assert sorted(kv.free_runs()) == [4, 8]
    kv.check_invariants()
    d = req("d", 9, 1)  # needs 16 in one piece: 12 free, but in pieces of 4 and 8
    assert kv.allocate_slots(d, 9) is None and kv.stats({}, {}, blocked=d).external_slots == 12
    kv.free(c)  # its buddy [0, 4) is free: [0, 8), then with [8, 16): the whole pool again
    assert kv.free_runs() == [16]
    assert kv.allocate_slots(d, 9) is not None
    kv.check_invariants()
    odd = get_allocator("static_oracle_buddy", 12, 1, max_model_len=16)  # a tree of 8 and one of 4
    assert sorted(odd.free_runs()) == [4, 8] and odd.blocks_for_request(7) == 8
    assert odd.allocate_slots(req("e", 5, 3), 5) is not None and odd.runs["e"] == (0, 8)
    assert odd.allocate_slots(req("f", 5, 4), 5) is None  # 9 -> 16: larger than either tree


def test_first_fit_placement_and_coalescing():
    kv = get_allocator("static_oracle", 100, 1, max_model_len=100)
    rs = [req(f"r{i}", 10, 10) for i in range(5)]  # 20 slots each
    for r in rs:
        kv.allocate_slots(r, 10)
    assert [kv.runs[r.request_id][0] for r in rs] == [0, 20, 40, 60, 80]
    kv.free(rs[1]), kv.free(rs[3])
    assert kv.free_runs() == [20, 20]
    big = req("big", 20, 20)  # 40 slots: 40 free, but in two holes
    assert kv.allocate_slots(big, 20) is None and kv.num_free_blocks == 40
    small = req("small", 5, 5)
    kv.allocate_slots(small, 5)
    assert kv.runs["small"] == (20, 10)  # first fit: the lowest hole
    kv.free(rs[2])
    assert kv.free_runs() == [50]  # 30..40 merged with 40..60 and 60..80
    kv.check_invariants()


class ContiguousMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        names = sorted(n for n in ALLOCATORS if n != "paged")
        self.kv = get_allocator(random.choice(names), 64, 2, max_model_len=40)
        self.live = {}
        self.n = 0

    @rule(prompt=st.integers(1, 30), out=st.integers(1, 10))
    def admit(self, prompt, out):
        self.n += 1
        r = req(f"r{self.n}", prompt, out)
        free = self.kv.num_free_blocks
        if self.kv.allocate_slots(r, prompt) is None:
            assert self.kv.num_free_blocks == free
        else:
            r.num_computed_tokens = prompt
            self.live[r.request_id] = r

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data):
        self.kv.free(self.live.pop(data.draw(st.sampled_from(sorted(self.live)))))

    @invariant()
    def consistent(self):
        self.kv.check_invariants()
        held = sorted((self.kv.runs[r][0], self.kv.runs[r][1]) for r in self.live)
        assert all(a[0] + a[1] <= b[0] for a, b in zip(held, held[1:]))
        s = self.kv.stats(
            {rid: r.num_computed_tokens for rid, r in self.live.items()},
            {rid: final_length(r, 40) for rid, r in self.live.items()},
        )
        assert s.token_slots + s.reserved_slots + s.internal_slots + s.external_slots + s.free_slots == 128


TestContiguousMachine = ContiguousMachine.TestCase
TestContiguousMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


# ---- the accounting ----------------------------------------------------------------------------------
def test_accounting_paged_tail_block():
    kv = PagedAllocator(10, 4)
    r = req("a", 5, 2)  # final length 7: 2 blocks, 1 slot never used
    kv.allocate_slots(r, 5)
    s = kv.stats({"a": 5}, {"a": 7})
    assert (s.token_slots, s.reserved_slots, s.internal_slots, s.external_slots, s.free_slots) == (5, 2, 1, 0, 32)
    assert s.used_token_slots == 5 and s.slack_token_slots == 3 and abs(sum(s.shares().values()) - 1) < 1e-12
    assert kv.stats({"a": 5}).reserved_slots == 3  # without final lengths: all slack is reserved


def test_accounting_shared_prefix_counts_once():
    kv = PagedAllocator(10, 4)
    a, b = req("a", 9, 1), req("b", 9, 1)  # same prompt: 2 full blocks shared
    kv.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    blocks, hit = kv.get_computed_blocks(b)
    assert hit == 8
    kv.allocate_slots(b, 1, blocks)
    s = kv.stats({"a": 9, "b": 9}, {"a": 10, "b": 10})
    assert s.used_blocks == 4 and s.token_slots == 8 + 1 + 1  # 2 shared full blocks + two tails
    assert s.reserved_slots == 2 and s.internal_slots == 4


def test_accounting_static_categories_and_external_fragmentation():
    kv = get_allocator("static_max", 100, 1, max_model_len=30)
    a = req("a", 5, 5)
    kv.allocate_slots(a, 5)
    s = kv.stats({"a": 5}, {"a": 10})  # holds 30 for a final length of 10
    assert (s.token_slots, s.reserved_slots, s.internal_slots, s.external_slots, s.free_slots) == (5, 5, 20, 0, 70)

    kv = get_allocator("static_oracle", 100, 1, max_model_len=100)
    a, b, c = req("a", 5, 5), req("b", 15, 15), req("c", 5, 5)
    for r in (a, b, c):  # [0, 10) [10, 40) [40, 50), hole [50, 100)
        kv.allocate_slots(r, r.num_prompt_tokens)
    kv.free(b)  # holes of 30 and 50
    counts, finals = {"a": 5, "c": 5}, {"a": 10, "c": 10}
    s = kv.stats(counts, finals)
    assert (s.token_slots, s.reserved_slots, s.internal_slots, s.external_slots, s.free_slots) == (10, 10, 0, 0, 80)
    d = req("d", 30, 30)  # needs 60 in one piece: 80 free, no such hole
    assert kv.allocate_slots(d, 30) is None
    s = kv.stats(counts, finals, blocked=d)
    assert s.external_slots == 80 and s.free_slots == 0
    e = req("e", 20, 20)  # needs 40: the 30-hole is too small for it
    assert kv.stats(counts, finals, blocked=e).external_slots == 30
    paged = PagedAllocator(25, 4)
    assert paged.stats({}, {}, blocked=d).external_slots == 0  # any free block serves any request


def test_engine_reports_fragmentation_for_every_allocator():
    """Paged holds mostly token states; each static variant wastes more, max the most (crafted load)."""
    shares = {}
    for cache, bs in [("paged", 4), ("static_max", 1), ("static_pow2", 1), ("static_oracle", 1)]:
        s = Sim("fcfs", cache=cache, num_blocks=400 // bs, block_size=bs, max_model_len=128)
        rng = random.Random(0)
        for i in range(30):
            s.add(f"r{i}", rng.randrange(10, 60), max_tokens=rng.randrange(5, 40))
        acc, n = {}, 0
        while s.pending or s.sched.has_unfinished():
            s.step()
            running = s.sched.running
            st = s.kv.stats(
                {r.request_id: r.num_computed_tokens for r in running},
                {r.request_id: final_length(r, 128) for r in running},
                s.sched.blocked_request,
            )
            if s.sched.waiting:  # saturated steps only
                n += 1
                for k, v in st.shares().items():
                    acc[k] = acc.get(k, 0) + v
        shares[cache] = {k: v / n for k, v in acc.items()}
    assert shares["paged"]["token"] > 0.85
    assert shares["static_max"]["token"] < shares["static_pow2"]["token"] < shares["paged"]["token"]
    assert shares["static_oracle"]["token"] < shares["paged"]["token"]
    assert shares["static_max"]["internal"] > shares["static_pow2"]["internal"] > shares["static_oracle"]["internal"]
    assert shares["static_oracle"]["reserved"] > shares["paged"]["reserved"]


# ---- eviction ----------------------------------------------------------------------------------------
def _hit_rate(eviction):
    """A hot system prompt reused every few requests among a stream of one-off prompts."""
    s = Sim("fcfs", num_blocks=24, block_size=4, max_num_seqs=1, eviction=eviction)
    hot = list(range(1000, 1032))  # 8 blocks
    rng = random.Random(0)
    for i in range(40):
        prompt = (
            hot + [rng.randrange(100, 900) for _ in range(3)]
            if i % 4 == 0 or i == 1
            else [rng.randrange(100, 900) for _ in range(36)]
        )
        s.add(f"r{i}", prompt, max_tokens=2, at=float(i))
    s.run()
    s.kv.pool.check_invariants()
    return s.kv.prefix_hit_rate


def test_lfu_keeps_a_hot_prefix_that_lru_evicts():
    lru, lfu = _hit_rate("lru"), _hit_rate("lfu")
    assert lfu > lru + 0.05, (lru, lfu)


def test_unknown_eviction_policy():
    with pytest.raises(ValueError, match="eviction"):
        PagedAllocator(4, 4, eviction="mru")


class LFUPoolMachine(RuleBasedStateMachine):
    """The block-pool properties (tests/test_block_pool_properties.py) with LFU eviction."""

    def __init__(self):
        super().__init__()
        self.kv = PagedAllocator(12, 2, True, eviction="lfu")
        self.live = {}
        self.n = 0

    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=14))
    def admit(self, prompt):
        self.n += 1
        r = Request(f"r{self.n}", prompt, SamplingParams())
        blocks, cached = self.kv.get_computed_blocks(r)
        if self.kv.allocate_slots(r, len(prompt) - cached, blocks) is not None:
            r.num_computed_tokens = len(prompt)
            self.live[r.request_id] = r

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data):
        self.kv.free(self.live.pop(data.draw(st.sampled_from(sorted(self.live)))))

    @invariant()
    def consistent(self):
        self.kv.pool.check_invariants()
        assert self.kv.pool.num_free_blocks + sum(1 for b in self.kv.pool.blocks if b.ref_cnt) == 12


TestLFUPool = LFUPoolMachine.TestCase
TestLFUPool.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
