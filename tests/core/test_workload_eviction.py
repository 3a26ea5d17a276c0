"""Workload-aware eviction (the paper's exponential reuse model, and the empirical-histogram variant) and the
host tier keep the block pool's invariants; the policies learn reuse."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from testbed.core.allocators.paged import PagedAllocator
from testbed.core.block_pool import BlockPool, KVCacheBlock
from testbed.core.host_tier import HostKVTier
from testbed.core.workload_eviction import WorkloadAwareFreeQueue
from testbed.core.workload_hist_eviction import EmpiricalReuseFreeQueue
from testbed.request import Request
from testbed.sampling_params import SamplingParams

from .policies.test_allocators import _hit_rate


class PoolMachine(RuleBasedStateMachine):
    """Admit and release requests of tiny prompts over a 12-block pool, workload eviction, with a host tier
    of 5 blocks: the pool and the tier stay consistent after every rule."""

    def __init__(self):
        super().__init__()
        self.kv = PagedAllocator(12, 2, True, eviction="workload")
        self.kv.host_tier = HostKVTier(self.kv, 5, first_id=3, write="back")
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

    @rule()
    def drain_copies(self):
        for src, dst, _kind in self.kv.take_copies():
            assert len(src) == len(dst)

    @invariant()
    def consistent(self):
        self.kv.pool.check_invariants()
        self.kv.host_tier.check_invariants()
        assert self.kv.pool.num_free_blocks + sum(1 for b in self.kv.pool.blocks if b.ref_cnt) == 12
        assert all(h in self.kv.host_tier.entries for h in self.kv.host_tier.pinned) and not self.kv.host_tier.pinned


TestWorkloadPool = PoolMachine.TestCase
TestWorkloadPool.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


class HistPoolMachine(PoolMachine):
    eviction = "workload_hist"


TestWorkloadHistPool = HistPoolMachine.TestCase
TestWorkloadHistPool.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)


def cached_blocks(n, category=None, depth=0, first=0):
    blocks = [KVCacheBlock(first + i) for i in range(n)]
    for b in blocks:
        b.block_hash, b.depth, b.request_class = 1000 + b.block_id, depth, category
    return blocks


def test_one_category_evicts_least_recently_freed_first():
    q = WorkloadAwareFreeQueue([])
    blocks = cached_blocks(6)
    for b in blocks[:3]:
        q.append(b)
    q.remove(blocks[1])  # a reuse: with one category it changes no order
    first = q.popleft()
    for b in blocks[3:]:
        q.append(b)
    assert [first.block_id] + [q.popleft().block_id for _ in range(4)] == [0, 2, 3, 4, 5]


def test_categories_without_data_tie_and_the_deeper_block_goes_first():
    q = WorkloadAwareFreeQueue([])
    head, tail = cached_blocks(1, "a", depth=1)[0], cached_blocks(1, "b", depth=5, first=1)[0]
    q.append(head)
    q.append(tail)
    assert q.popleft() is tail  # freed later, but deeper in its prompt: the paper's -offset


def test_a_category_that_is_never_reused_goes_before_one_reused_soon():
    q = WorkloadAwareFreeQueue([])
    hot, cold = cached_blocks(1, "hot")[0], cached_blocks(1, "cold", first=1)[0]
    c = q._category("hot")
    c.reuses, c.reuse_time = 10, 10.0
    q._category("cold").unreused = 10
    q.append(hot)
    q.append(cold)
    assert q.popleft() is cold  # LRU would evict hot (freed first)


def test_reuse_probability_decays_with_the_categorys_reuse_time():
    """A block of a category reused within ~1 tick is unlikely to be reused once idle for 30; one of a
    category reused after ~100 ticks still is at 60: the younger block goes first."""
    q = WorkloadAwareFreeQueue([])
    for key, mean in (("quick", 1.0), ("slow", 100.0)):
        c = q._category(key)
        c.reuses, c.reuse_time = 20, 20 * mean
    q.life = 100.0
    slow, quick = cached_blocks(1, "slow")[0], cached_blocks(1, "quick", first=1)[0]
    q.append(slow)
    fillers = [KVCacheBlock(10 + i) for i in range(60)]  # blocks caching nothing: handed out first
    for b in fillers[:30]:
        q.append(b)
    for _ in range(30):
        q.popleft()
    q.append(quick)
    for b in fillers[30:]:
        q.append(b)
    for _ in range(30):
        q.popleft()
    assert q.popleft() is quick and q.popleft() is slow


def test_an_evicted_hash_cached_again_counts_as_its_categorys_reuse():
    pool = BlockPool(2, True, "workload")
    (b,) = pool.get_new_blocks(1)
    pool.cache_block(b, 111, 0, "x")
    pool.free_blocks([b])
    both = pool.get_new_blocks(2)  # evicts 111: the queue keeps it as a ghost
    assert pool.free_queue.categories["x"].reuses == 0
    pool.free_blocks(both)
    (again,) = pool.get_new_blocks(1)
    pool.cache_block(again, 111, 0, "y")  # the workload asked for it again: a reuse the policy missed
    assert pool.free_queue.categories["x"].reuses == 1


def test_histogram_policy_keeps_a_hot_prefix_that_lru_evicts():
    lru, workload = _hit_rate("lru"), _hit_rate("workload_hist")
    assert workload > lru + 0.05, (lru, workload)


def test_the_class_with_the_lower_learned_reuse_is_evicted_first():
    blocks = [KVCacheBlock(i) for i in range(6)]
    for b in blocks:
        b.block_hash, b.depth = 100 + b.block_id, 0 if b.block_id < 3 else 8
    q = EmpiricalReuseFreeQueue([])
    for b in blocks:
        q.append(b)
    q.remove(blocks[0])  # shallow blocks were reused when idle: their class learns a high reuse chance
    q.remove(blocks[1])
    # LRU would evict block 2 (freed first); the deep blocks, with only the prior, go before it
    assert [q.popleft().block_id for _ in range(4)] == [3, 4, 5, 2]
    assert len(q) == 0


def test_the_request_class_label_separates_blocks_of_one_depth():
    """Blocks of one depth and hit history differ only by their caching request's label (a session's turn
    index): the label whose blocks were reused is kept, the other evicted first."""
    blocks = [KVCacheBlock(i) for i in range(6)]
    for b in blocks:
        b.block_hash, b.depth, b.request_class = 100 + b.block_id, 0, 0 if b.block_id < 3 else 1
    q = EmpiricalReuseFreeQueue([])
    for b in blocks:
        q.append(b)
    q.remove(blocks[0])
    q.remove(blocks[1])
    assert [q.popleft().block_id for _ in range(4)] == [3, 4, 5, 2]
    # without labels the six blocks share one class: least recently freed first
    q = EmpiricalReuseFreeQueue([])
    for b in blocks:
        b.request_class = None
        q.append(b)
    q.remove(blocks[0])
    q.remove(blocks[1])
    assert [q.popleft().block_id for _ in range(4)] == [2, 3, 4, 5]


def test_the_kv_manager_labels_cached_blocks_with_the_request_class():
    kv = PagedAllocator(8, 2, True, eviction="workload")
    r = Request("r", [1, 2, 3, 4, 5], SamplingParams(extra_args={"request_class": 3}))
    blocks, cached = kv.get_computed_blocks(r)
    kv.allocate_slots(r, 5 - cached, blocks)
    r.num_computed_tokens = 5
    kv.free(r)
    labelled = [b for b in kv.pool.blocks if b.block_hash is not None]
    assert len(labelled) == 2 and all(b.request_class == 3 for b in labelled)


def test_the_kv_manager_reports_a_recomputed_evicted_prefix_as_a_reuse():
    kv = PagedAllocator(2, 2, True, eviction="workload")

    def run(rid, prompt):
        r = Request(rid, prompt, SamplingParams(extra_args={"request_class": 0}))
        blocks, cached = kv.get_computed_blocks(r)
        assert kv.allocate_slots(r, len(prompt) - cached, blocks) is not None
        r.num_computed_tokens = len(prompt)
        kv.free(r)

    run("a", [1, 2, 3])  # caches one full block
    run("b", [7, 8, 9, 10])  # needs both blocks: evicts a's
    assert kv.pool.free_queue.categories[0].reuses == 0
    run("a2", [1, 2, 3])  # a's block is computed and cached again
    assert kv.pool.free_queue.categories[0].reuses == 1
