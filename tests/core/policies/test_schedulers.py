"""Each scheduling policy's defining behaviour on a crafted workload (model-free scheduler loop)."""

import pytest

from testbed.core.allocators.base import CopyKind
from testbed.core.policies import POLICIES, get_policy

from .helpers import Sim


def test_registry_has_every_policy():
    assert {"fcfs", "priority", "sjf", "sarathi", "mlfq", "lpm"} <= set(POLICIES)
    with pytest.raises(ValueError, match="unknown scheduler"):
        get_policy("nope")
    with pytest.raises(TypeError):
        get_policy("sjf", bogus=1)


# ---- sjf --------------------------------------------------------------------------------------------
def test_sjf_finishes_short_job_before_earlier_long_one():
    for policy, order in [("fcfs", ["busy", "long", "short"]), ("sjf", ["busy", "short", "long"])]:
        s = Sim(policy, max_num_seqs=1)
        s.add("busy", 8, max_tokens=10, at=0.0)  # holds the only seat while both others queue
        s.add("long", 8, max_tokens=40, at=1.0)
        s.add("short", 8, max_tokens=3, at=2.0)
        s.run()
        assert s.finish_order == order, (policy, s.finish_order)


def test_sjf_by_prompt_length():
    s = Sim("sjf", max_num_seqs=1, by="prompt")
    s.add("long_prompt", 60, max_tokens=2)
    s.add("short_prompt", 5, max_tokens=30)
    s.run()
    assert s.finish_order == ["short_prompt", "long_prompt"]


def test_sjf_aging_prevents_starvation():
    """A stream of short jobs starves a long one without aging; with aging the long one gets in."""

    def finish_step_of_long(aging):
        s = Sim("sjf", max_num_seqs=1, aging=aging)
        s.add("long", 4, max_tokens=30, at=0.0)
        for i in range(40):
            s.add(f"s{i}", 4, max_tokens=2, at=float(i * 2))
        s.run()
        return s.finish_order.index("long")

    assert finish_step_of_long(0.0) == 40  # last: every short job jumped ahead
    assert finish_step_of_long(5.0) < 10  # aged past the short ones within a few seconds


# ---- priority ----------------------------------------------------------------------------------------
def test_priority_preempts_lower_priority_running_request():
    s = Sim("priority", max_num_seqs=1)
    low = s.add("low", 8, max_tokens=30, at=0.0, priority=1)
    s.add("high", 8, max_tokens=5, at=3.0, priority=0)
    s.run()
    assert s.finish_order == ["high", "low"]
    assert low.num_preemptions == 1
    preempting = [st for st in s.steps if st["out"].preempted]
    assert [r.request_id for r in preempting[0]["out"].preempted] == ["low"]
    assert preempting[0]["ids"] == ["high"]  # the high one runs in the very step it preempts


def test_priority_memory_victim_is_lowest_priority():
    for policy, victim in [("priority", "lo_first"), ("fcfs", "hi_second")]:  # fcfs: the latest arrival
        s = Sim(policy, num_blocks=12, block_size=4)
        s.add("lo_first", 8, max_tokens=20, at=0.0, priority=5)
        s.add("hi_second", 8, max_tokens=20, at=0.5, priority=0)
        s.run()
        preempted = {r.request_id for st in s.steps for r in st["out"].preempted}
        assert preempted == {victim}, (policy, preempted)


def test_priority_without_preemption_and_fcfs_never_preempt_for_waiting():
    for policy, opts in [("fcfs", {}), ("priority", {"preempt": False})]:
        s = Sim(policy, max_num_seqs=1, **opts)
        low = s.add("low", 8, max_tokens=30, at=0.0, priority=1)
        s.add("high", 8, max_tokens=5, at=3.0, priority=0)
        s.run()
        assert s.finish_order == ["low", "high"] and low.num_preemptions == 0


def test_priority_high_share_from_config_is_deterministic():
    p = get_policy("priority", high_share=0.5, seed=3)
    s = Sim()
    reqs = [s.add(f"r{i}", 4, 2) for i in range(200)]
    boosted = [p.priority(r) for r in reqs]
    assert 70 < boosted.count(-1) < 130 and set(boosted) == {0, -1}
    assert boosted == [get_policy("priority", high_share=0.5, seed=3).priority(r) for r in reqs]


# ---- sarathi -----------------------------------------------------------------------------------------
def _mixed(s):
    for i in range(6):
        s.add(f"d{i}", 10, max_tokens=30, at=0.0)
    for i in range(8):
        s.add(f"p{i}", 150, max_tokens=10, at=float(3 + 4 * i))
    return s.run()


@pytest.mark.parametrize("num_blocks", [64, 40])  # 40: memory pressure, preempted requests re-prefill
def test_sarathi_decodes_never_wait_behind_prefill_chunks_and_budget_holds(num_blocks):
    s = _mixed(Sim("sarathi", budget=512, token_budget=64, num_blocks=num_blocks, block_size=8))
    assert num_blocks == 64 or s.sched.num_preemptions > 0
    assert max(st["tokens"] for st in s.steps) <= 64
    for st in s.steps:
        out = st["out"]
        left_out = [r for r in st["decodes_before"] if r.request_id not in st["ids"] and r not in out.preempted]
        if out.num_prefill_tokens:
            assert not left_out, "a decode waited while a prefill chunk ran"
        # decodes come first in the batch
        kinds = [n == 1 and r in st["decodes_before"] for r, n in zip(out.requests, out.num_new_tokens)]
        assert kinds == sorted(kinds, reverse=True)
    assert any(st["out"].num_prefill_tokens and st["out"].num_decode_tokens for st in s.steps)  # mixed steps


# ---- mlfq --------------------------------------------------------------------------------------------
def test_mlfq_levels_skip_join_and_demotion():
    p = get_policy("mlfq", num_levels=5, base_quantum=2, prefill_tokens_per_iter=16)
    s = Sim()
    short_prompt, long_prompt = s.add("a", 10, 100), s.add("b", 200, 100)
    assert p.join_level(short_prompt) == 0
    assert p.join_level(long_prompt) == 3  # 13 prefill iterations -> quantum 16
    levels = []
    for _ in range(40):
        levels.append(p.level(short_prompt))
        short_prompt.append_output_token(7, None, 0.0)
    # quanta 2, 4, 8, 16: demoted after 2, 6, 14 and 30 tokens, capped at the last level
    assert levels[:2] == [0, 0] and levels[2:6] == [1] * 4 and levels[6:14] == [2] * 8
    assert levels[14:30] == [3] * 16 and levels[30:] == [4] * 10


def test_mlfq_demotes_long_job_and_new_short_job_preempts_it():
    s = Sim("mlfq", max_num_seqs=1, base_quantum=2)
    long = s.add("long", 8, max_tokens=60, at=0.0)
    s.add("short", 8, max_tokens=3, at=10.0)
    s.run()
    assert s.finish_order == ["short", "long"]
    assert long.num_preemptions >= 1
    # fcfs (and mlfq with preemption off) let the long job finish first
    for policy, opts in [("fcfs", {}), ("mlfq", {"preempt": False, "base_quantum": 2})]:
        t = Sim(policy, max_num_seqs=1, **opts)
        t.add("long", 8, max_tokens=60, at=0.0)
        t.add("short", 8, max_tokens=3, at=10.0)
        assert t.run().finish_order == ["long", "short"]


def test_mlfq_orders_running_by_level():
    s = Sim("mlfq", budget=3, base_quantum=2)
    s.add("old", 4, max_tokens=40, at=0.0)
    s.add("young", 4, max_tokens=40, at=8.0)
    for _ in range(12):
        s.step()
    # once "old" is demoted below "young", "young" takes the budget first
    last = s.steps[-1]["ids"]
    assert last[0] == "young"


# ---- lpm ---------------------------------------------------------------------------------------------
def test_lpm_orders_by_cached_prefix():
    shared = list(range(100, 140))
    for policy, expect_first in [("fcfs", "x_cold"), ("lpm", "y_warm")]:
        s = Sim(policy, max_num_seqs=1, num_blocks=64, block_size=4)
        s.add("warmup", shared + [1, 2, 3], max_tokens=2, at=0.0)
        s.run()
        s.add("x_cold", list(range(500, 540)), max_tokens=2, at=s.clock.t)
        s.add("y_warm", shared + [9, 9, 9], max_tokens=2, at=s.clock.t + 0.5)
        s.clock.t += 1
        s.run()
        assert s.finish_order[1] == expect_first, (policy, s.finish_order)
    assert s.kv.prefix_hits >= 40


def test_lpm_key_prefers_longer_match_and_falls_back_to_arrival():
    s = Sim("lpm", max_queue=2)
    shared = list(range(100, 132))
    s.add("warm", shared + [1], 1)
    s.run()
    a = s.add("a", list(range(600, 640)), 1, at=s.clock.t)
    b = s.add("b", shared[:16] + [5] * 10, 1, at=s.clock.t + 0.1)
    c = s.add("c", shared + [5] * 3, 1, at=s.clock.t + 0.2)
    for r in (a, b):
        s.sched.add_request(r)
    policy = s.sched.policy
    keys = {r.request_id: policy.key(r, 0) for r in (a, b)}
    assert keys["b"] < keys["a"]
    s.sched.add_request(c)  # three waiting > max_queue: arrival order
    assert policy.key(a, 0) < policy.key(b, 0) < policy.key(c, 0)


# ---- swap at the scheduler level ------------------------------------------------------------------
def test_swap_preemption_keeps_progress_and_copies_blocks_back():
    s = Sim("fcfs", num_blocks=10, block_size=4, swap_blocks=64)
    a = s.add("a", 10, max_tokens=16)
    b = s.add("b", 10, max_tokens=16)
    s.run()
    assert s.sched.num_preemptions >= 1 and s.sched.swap.num_swap_outs >= 1
    outs = [c for c in s.copies if c[2] is CopyKind.TO_HOST]
    ins = [c for c in s.copies if c[2] is CopyKind.TO_DEVICE]
    assert len(outs) == len(ins) == s.sched.swap.num_swap_ins
    for (dev, host, _), (host2, dev2, _) in zip(outs, ins):
        assert host == host2 and len(dev) == len(dev2)
    assert s.sched.swap.num_free == 64 and not s.sched.swap.swapped
    assert a.num_output_tokens == b.num_output_tokens == 16
    s.kv.pool.check_invariants()


def test_swap_falls_back_to_recompute_when_host_pool_is_short():
    s = Sim("fcfs", num_blocks=10, block_size=4, swap_blocks=1)
    s.add("a", 10, max_tokens=16)
    s.add("b", 10, max_tokens=16)
    s.run()
    assert s.sched.num_preemptions >= 1 and s.sched.swap.num_swap_outs == 0


def test_abort_of_swapped_request_frees_host_blocks():
    s = Sim("priority", max_num_seqs=1, swap_blocks=16)
    low = s.add("low", 8, max_tokens=30, at=0.0, priority=1)
    s.add("high", 8, max_tokens=30, at=3.0, priority=0)
    for _ in range(5):
        s.step()
    assert s.sched.swap.holds(low)
    s.sched.abort("low")
    assert s.sched.swap.num_free == 16
    s.run()
