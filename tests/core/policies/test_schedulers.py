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
        s = Sim(policy, max_num_seqs=1, **({"aging": 0.0} if policy == "sjf" else {}))
        s.add("busy", 8, max_tokens=10, at=0.0)  # holds the only seat while both others queue
        s.add("long", 8, max_tokens=40, at=1.0)
        s.add("short", 8, max_tokens=3, at=2.0)
        s.run()
        assert s.finish_order == order, (policy, s.finish_order)


def test_sjf_by_prompt_length():
    s = Sim("sjf", max_num_seqs=1, by="prompt", aging=0.0)
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


def test_sjf_default_aging_bounds_starvation():
    """SJF's default must not starve long requests under load (pure SJF, aging 0, did: the long job ran
    only after a stream of 60 short ones)."""
    from testbed.core.policies.sjf import SJFPolicy

    assert SJFPolicy().aging > 0

    def long_job_ttft(**options):
        s = Sim("sjf", max_num_seqs=1, num_blocks=256, **options)
        long = s.add("long", 4, max_tokens=400, at=0.0)
        s.add("busy", 4, max_tokens=3, at=0.0)
        for i in range(60):  # a short job every 3 s, each holding the seat for ~3 steps: a queue builds
            s.add(f"s{i}", 4, max_tokens=4, at=1.0 + 3 * i)
        s.run()
        return long.first_token_time - long.arrival_time

    assert long_job_ttft(aging=0.0) > 150
    assert long_job_ttft() < 10  # default aging: 400 - 4 tokens forgiven within ~4 s


def test_sjf_aging_order_is_static():
    """size - aging * waited orders requests like size + aging * arrival: no per-step re-sort needed."""
    p = get_policy("sjf", aging=10.0)
    assert not p.time_dependent
    s = Sim()
    a, b = s.add("a", 4, max_tokens=100, at=0.0), s.add("b", 4, max_tokens=50, at=6.0)
    assert p.key(a, 6.0) < p.key(b, 6.0)  # 100 - 60 < 50 - 0
    c = s.add("c", 4, max_tokens=50, at=4.0)
    assert p.key(c, 6.0) < p.key(a, 6.0)  # 50 - 20 < 100 - 60


# ---- priority ----------------------------------------------------------------------------------------
def test_priority_preempts_lower_priority_running_request():
    s = Sim("priority", max_num_seqs=1, preemption="waiting")
    low = s.add("low", 8, max_tokens=30, at=0.0, priority=1)
    s.add("high", 8, max_tokens=5, at=3.0, priority=0)
    s.run()
    assert s.finish_order == ["high", "low"]
    assert low.num_preemptions == 1
    preempting = [st for st in s.steps if st["out"].preempted]
    assert [r.request_id for r in preempting[0]["out"].preempted] == ["low"]
    assert preempting[0]["ids"] == ["high"]  # the high one runs in the very step it preempts


@pytest.mark.parametrize("preemption", ["memory", "waiting"])
def test_priority_memory_victim_is_lowest_priority(preemption):
    for policy, victim in [("priority", "lo_first"), ("fcfs", "hi_second")]:  # fcfs: the latest arrival
        opts = {"preemption": preemption} if policy == "priority" else {}
        s = Sim(policy, num_blocks=12, block_size=4, **opts)
        s.add("lo_first", 8, max_tokens=20, at=0.0, priority=5)
        s.add("hi_second", 8, max_tokens=20, at=0.5, priority=0)
        s.run()
        preempted = {r.request_id for st in s.steps for r in st["out"].preempted}
        assert preempted == {victim}, (policy, preempted)


def test_priority_default_is_vllm_v1_memory_only_preemption():
    """vLLM v1 preempts only when a running request's memory allocation fails; v0 (preemption=waiting) also
    frees a seat for a higher-priority waiting request. The default is v1's."""
    from testbed.core.policies.priority import PriorityPolicy

    assert PriorityPolicy().preemption == "memory"
    with pytest.raises(ValueError, match="preemption"):
        get_policy("priority", preemption="always")
    for policy, opts in [("fcfs", {}), ("priority", {}), ("priority", {"preemption": "memory"})]:
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


def _mlfq_long_job_finish(**options):
    """One seat; a 64-token job at t=0, then a short job every 2 s (each needs 3 steps: overload)."""
    s = Sim("mlfq", max_num_seqs=1, base_quantum=2, **options)
    s.add("long", 8, max_tokens=64, at=0.0)
    for i in range(150):
        s.add(f"s{i}", 8, max_tokens=3, at=1.0 + 2 * i)
    s.run()
    return s.finish_order.index("long"), s.sched.policy


def test_mlfq_promotes_starving_jobs():
    """FastServe promotes a job that waited past a starvation limit to the top queue; without promotion the
    demoted long job waits for the whole stream of short jobs (it finished last, after 150 of them)."""
    starved, _ = _mlfq_long_job_finish(starve_limit_s=None)
    assert starved == 150
    promoted, policy = _mlfq_long_job_finish(starve_limit_s=10.0)
    assert promoted < 120 and policy.num_promotions > 0, promoted  # done while the stream still runs
    assert _mlfq_long_job_finish(starve_limit_s=5.0)[0] < promoted  # a shorter limit: sooner
    assert get_policy("mlfq").starve_limit_s is not None  # on by default
    with pytest.raises(ValueError, match="starve_limit_s"):
        get_policy("mlfq", starve_limit_s=0)


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
    s.sched.add_request(c)  # three waiting > max_queue: arrival order from the next step on
    policy.begin_step(0, s.sched.waiting, s.sched.requests)
    assert policy.key(a, 0) < policy.key(b, 0) < policy.key(c, 0)


def _lpm_queue(n_warm, max_queue):
    """A cached prefix, then one cold request and n_warm later ones sharing the prefix, all waiting."""
    s = Sim("lpm", max_num_seqs=1, num_blocks=512, block_size=4, max_queue=max_queue)
    shared = list(range(100, 140))
    s.add("warmup", shared + [1], 1)
    s.run()
    t = s.clock.t
    s.add("cold", list(range(600, 640)), 1, at=t)
    for i in range(n_warm):
        s.add(f"w{i}", shared + [i, i], 1, at=t + 0.01 * (i + 1))
    s.clock.t += 1
    return s


def test_lpm_falls_back_to_arrival_order_when_the_queue_is_long():
    """SGLang's fallback: above max_queue waiting requests, arrival order. The old key read the queue's
    length while schedule() sorted it in place (CPython shows a list being sorted as empty), so the
    fallback never triggered and every step matched every waiting request against the cache."""
    assert _lpm_queue(3, max_queue=8).run().finish_order[1] == "w0"  # short queue: longest prefix first
    s = _lpm_queue(12, max_queue=8)
    lookups = 0
    lookup = s.kv.get_computed_blocks

    def counted(request):
        nonlocal lookups
        lookups += 1
        return lookup(request)

    while s.pending:  # into the queue first: count only what schedule() looks up
        s.sched.add_request(s.pending.pop(0)[1])
    s.kv.get_computed_blocks = counted
    s.step()  # 13 waiting > 8: arrival order, no prefix matching for the ordering
    assert lookups <= 2, lookups  # the admitted request's own lookup
    assert s.steps[-1]["ids"] == ["cold"]
    s.run()
    assert s.finish_order[1] == "cold"
    # insertions within a step use the step's key: the waiting queue is in the order the step decided
    policy = s.sched.policy
    keys = [policy.key(r, 0) for r in s.sched.waiting]
    assert keys == sorted(keys)


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
    s = Sim("priority", max_num_seqs=1, swap_blocks=16, preemption="waiting")
    low = s.add("low", 8, max_tokens=30, at=0.0, priority=1)
    s.add("high", 8, max_tokens=30, at=3.0, priority=0)
    for _ in range(5):
        s.step()
    assert s.sched.swap.holds(low)
    s.sched.abort("low")
    assert s.sched.swap.num_free == 16
    s.run()
