"""Property tests: any sequence of allocate / append / free / preempt / abort keeps the pool consistent."""

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from testbed.core.allocators.paged import PagedAllocator
from testbed.executor.block_tables import BlockTables
from testbed.request import Request
from testbed.sampling_params import SamplingParams


class PoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.kv = None
        self.live: dict[str, Request] = {}
        self.n = 0

    @precondition(lambda self: self.kv is None)
    @rule(num_blocks=st.integers(1, 24), block_size=st.sampled_from([1, 2, 3, 4, 16]), caching=st.booleans())
    def setup(self, num_blocks, block_size, caching):
        self.kv = PagedAllocator(num_blocks, block_size, caching)
        # persistent block-table rows kept by the manager's change reports only (tiny: rows/width grow)
        self.tables = BlockTables(1, 1)

    @precondition(lambda self: self.kv is not None)
    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=20))
    def admit(self, prompt):
        """A new request: prefix lookup, then allocate its whole prompt (or fail cleanly)."""
        self.n += 1
        req = Request(f"r{self.n}", prompt, SamplingParams())
        before = self.kv.pool.num_free_blocks
        blocks, num_cached = self.kv.get_computed_blocks(req)
        assert num_cached < len(prompt)
        if self.kv.allocate_slots(req, len(prompt) - num_cached, blocks) is None:
            assert self.kv.pool.num_free_blocks == before and req.request_id not in self.kv.req_blocks
            return
        req.num_computed_tokens = len(prompt)
        self.live[req.request_id] = req

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(0, 2))
    def append(self, data, token):
        """Decode one token: room for it, then it becomes computed."""
        req = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        req.all_token_ids.append(token)
        if self.kv.allocate_slots(req, 1) is None:
            req.all_token_ids.pop()
            return
        req.num_computed_tokens += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data(), how=st.sampled_from(["finish", "preempt", "abort"]))
    def release(self, data, how):
        req = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        self.kv.free(req)
        if how != "preempt":
            self.tables.apply([req.request_id], {})
        if how == "preempt":
            req.num_computed_tokens = 0  # may be re-admitted later as a new request

    @precondition(lambda self: self.live)
    @rule(data=st.data(), keep=st.integers(1, 30))
    def trim(self, data, keep):
        """Rejected speculative tokens: give back blocks beyond `keep` tokens."""
        req = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        keep = min(keep, req.num_computed_tokens)
        self.kv.trim(req, keep)
        req.num_computed_tokens = keep
        del req.all_token_ids[keep:]
        req.block_hashes = req.block_hashes[: keep // self.kv.block_size]

    @invariant()
    def consistent(self):
        if self.kv is None:
            return
        pool = self.kv.pool
        pool.check_invariants()
        holders = Counter(b.block_id for blocks in self.kv.req_blocks.values() for b in blocks)
        for block in pool.blocks:
            assert block.ref_cnt == holders.get(block.block_id, 0), block
        for rid, blocks in self.kv.req_blocks.items():
            ids = [b.block_id for b in blocks]
            assert len(ids) == len(set(ids)), f"{rid} holds a block twice"
            assert len(blocks) >= self.kv.blocks_needed(self.live[rid].num_computed_tokens)
        for block_id, count in holders.items():
            if count > 1:  # only cached (full, hashed) blocks may be shared
                assert pool.blocks[block_id].block_hash is not None
        # the O(1) accounting counters
        bs = self.kv.block_size
        assert self.kv.num_held_blocks_total == sum(len(b) for b in self.kv.req_blocks.values())
        assert self.kv.num_internal_slots == sum(
            max(0, len(self.kv.req_blocks.get(rid, ())) * bs - r.max_num_tokens) for rid, r in self.live.items()
        )
        # allocate_slots' no-op window: the held blocks have room, no further block becomes full
        for rid, limit in self.kv.req_fast_limit.items():
            assert limit <= len(self.kv.req_blocks[rid]) * bs
            if self.kv.enable_prefix_caching:
                assert limit < (self.kv.req_num_hashed.get(rid, 0) + 1) * bs
        # the persistent rows, kept from change reports only
        self.tables.apply([], self.kv.take_block_updates())
        ids = sorted(self.live)
        for rid, row in zip(ids, self.tables.rows(ids)):
            assert self.tables.table[row, : len(self.kv.req_blocks[rid])].tolist() == self.kv.get_block_ids(rid)

    def teardown(self):
        if self.kv is None:
            return
        for req in list(self.live.values()):
            self.kv.free(req)
        assert self.kv.pool.num_free_blocks == self.kv.num_blocks
        self.kv.pool.check_invariants()


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_duplicate_full_blocks_stay_hittable():
    """Two requests computing the same prompt at once each fill blocks with the same hashes. Both copies are
    counted as cached, so both must be hittable: after the first copy is evicted, the second serves hits
    (vLLM v1 keeps duplicates in its hash map; first-writer-wins left the second unreachable)."""
    kv = PagedAllocator(num_blocks=8, block_size=4)
    prompt = list(range(10, 19))  # 9 tokens: 2 full blocks + 1 token
    r1, r2 = (Request(rid, prompt, SamplingParams()) for rid in ("r1", "r2"))
    assert kv.get_computed_blocks(r1)[1] == kv.get_computed_blocks(r2)[1] == 0  # both looked up: no hit yet
    kv.allocate_slots(r1, len(prompt))
    kv.allocate_slots(r2, len(prompt))
    r2_full_blocks = kv.get_block_ids("r2")[:2]
    kv.free(r1)  # r1's copies join the free queue first, so they are evicted first
    kv.free(r2)
    assert kv.pool.num_cached_free == 4
    filler = Request("filler", list(range(100, 120)), SamplingParams())
    kv.allocate_slots(filler, 20)  # 5 blocks: the 2 never used and all 3 of r1's
    assert kv.pool.num_cached_free == 2  # r2's two full blocks
    kv.pool.check_invariants()
    r3 = Request("r3", prompt, SamplingParams())
    blocks, num_hit = kv.get_computed_blocks(r3)
    assert num_hit == 8 and [b.block_id for b in blocks] == r2_full_blocks
