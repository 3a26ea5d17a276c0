"""Parallel sampling at the KV-cache and scheduler level: the fork shares the prompt's blocks by ref count,
a shared block is copied before anyone writes into it (and the copy reaches the executor in the
SchedulerOutput), a group holds seats for all its sequences until the fork, sequences are preempted alone,
the pool invariants hold every step and every block is free when the groups are done."""

import random

import pytest

from testbed import LLM, SamplingParams
from testbed.core.allocators.base import CopyKind
from testbed.request import RequestStatus

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_checked(engine, requests):
    """Step an engine through requests [(id, prompt, params)], checking budgets, seats, ref counts and copies
    every step. Returns (finished group/request outputs by id, every SchedulerOutput)."""
    sched, kv, cfg = engine.scheduler, engine.kv, engine.scheduler.config
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    finished, outs = {}, []
    while engine.has_unfinished():
        out = sched.schedule()
        outs.append(out)
        assert len(sched.running) + sched.num_reserved_seats <= cfg.max_num_seqs
        assert len(out.requests) <= cfg.max_num_seqs
        # computed counts advance when scheduled: the step writes from out.num_computed_tokens on
        for req, n, before in zip(out.requests, out.num_new_tokens, out.num_computed_tokens):
            assert req.status is RequestStatus.RUNNING
            blocks = kv.req_blocks[req.request_id]
            assert len(blocks) * kv.block_size >= before + n
            # nothing is written into a block someone else holds
            for b in blocks[before // kv.block_size :]:
                assert b.ref_cnt == 1, (req, b)
        for src, dst, kind in out.kv_copies:
            if kind is CopyKind.ON_DEVICE:
                assert len(src) == len(dst) == 1 and src != dst
        for req in out.preempted:
            assert req.request_id not in kv.req_blocks and req.num_computed_tokens == 0
        result = engine.executor.execute(out)
        for o in engine.output_processor.process(sched.update(out, result.sampled, result.logprobs)):
            if o.finished:
                finished[o.request_id] = o
        kv.pool.check_invariants()
        holders = {}
        for blocks in kv.req_blocks.values():
            for b in blocks:
                holders[b.block_id] = holders.get(b.block_id, 0) + 1
        for block_id, count in holders.items():  # every reference is a holder's
            assert kv.pool.blocks[block_id].ref_cnt == count
    assert kv.num_free_blocks == kv.num_blocks and not kv.req_blocks and not kv.req_may_share
    assert sched.num_reserved_seats == 0 and not engine.output_processor.groups
    return finished, outs


def tiny(**kw):
    args = dict(model="tiny", block_size=4, num_blocks=256, max_model_len=256, max_num_seqs=16)
    return LLM(**{**args, **kw}).engine


@pytest.mark.parametrize("prompt_len, copies", [(22, 3), (21, 0), (20, 3), (1, 0)])
def test_fork_shares_prompt_blocks_and_copies_the_partial_one(prompt_len, copies):
    """n=4 over a prompt of L tokens: the siblings share the blocks of the first L - 1 tokens; the block
    holding position L - 1 is copied by all but one holder when L - 1 is not a block boundary."""
    engine = tiny()
    prompt = [100 + i for i in range(prompt_len)]
    params = SamplingParams(n=4, seed=1, max_tokens=6, ignore_eos=True)
    engine.add_request("g", prompt, params)
    kv, bs = engine.kv, engine.kv.block_size
    while not engine.scheduler.requests.get("1_g"):  # until the fork
        engine.step()
    shared = kv.req_blocks["0_g"][: kv.blocks_needed(prompt_len - 1)]
    for i in range(1, 4):
        assert kv.req_blocks[f"{i}_g"] == shared
        assert engine.scheduler.requests[f"{i}_g"].num_computed_tokens == prompt_len - 1
    assert all(b.ref_cnt == 4 for b in shared)
    used_at_fork = kv.num_blocks - kv.num_free_blocks
    engine.step()  # each sibling computes the prompt's last token; the leader its second token
    assert kv.num_cow_copies == copies
    full = (prompt_len - 1) // bs
    tails = {kv.req_blocks[f"{i}_g"][full].block_id for i in range(4)}
    assert len(tails) == 4  # every sequence writes its own tail block
    assert all(kv.req_blocks[f"{i}_g"][:full] == kv.req_blocks["0_g"][:full] for i in range(4))
    assert kv.num_blocks - kv.num_free_blocks >= used_at_fork
    while engine.has_unfinished():
        engine.step()
    assert kv.num_free_blocks == kv.num_blocks
    kv.pool.check_invariants()


def test_copies_reach_the_executor_in_the_scheduler_output():
    engine = tiny()
    finished, outs = run_checked(engine, [("g", list(range(100, 122)), SamplingParams(n=3, max_tokens=5))])
    copies = [c for out in outs for c in out.kv_copies]
    assert [k for _, _, k in copies] == [CopyKind.ON_DEVICE] * 2 == [CopyKind.ON_DEVICE] * engine.kv.num_cow_copies
    # the destination block is in the block update of the sequence that copied, in the same output
    for out in outs:
        for _src, dst, _ in out.kv_copies:
            assert any(dst[0] in ids for _, ids in out.block_updates.values())
    assert [c.index for c in finished["g"].outputs] == [0, 1, 2]


@pytest.mark.parametrize(
    "max_seqs, num_blocks, chunk, ns", [(6, 200, 32, (1, 2, 6)), (4, 18, 32, (1, 2)), (8, 28, 16, (1, 2, 3))]
)
def test_invariants_hold_with_groups_under_memory_pressure(max_seqs, num_blocks, chunk, ns):
    """Groups and plain requests mixed, with preemption (tight caches): seats, ref counts, copies and pool
    invariants every step; every sequence finishes at its length; every block is free at the end."""
    rng = random.Random(max_seqs)
    engine = tiny(max_num_seqs=max_seqs, num_blocks=num_blocks, max_num_batched_tokens=chunk)
    requests = []
    for i in range(10):
        prompt = [rng.randrange(100, 4000) for _ in range(rng.randrange(8, 21))]
        n = rng.choice(ns)  # up to 35 tokens: a group of n x 9 blocks fits
        params = SamplingParams(n=n, max_tokens=rng.randrange(8, 16), ignore_eos=True, seed=i)
        requests.append((f"r{i}", prompt, params))
    finished, outs = run_checked(engine, requests)
    if num_blocks < 100:
        assert any(out.preempted for out in outs)
    assert sorted(finished) == sorted(r[0] for r in requests)
    for rid, _, params in requests:
        outputs = finished[rid].outputs
        assert [c.index for c in outputs] == list(range(params.n))
        assert all(len(c.token_ids) == params.max_tokens and c.finish_reason == "length" for c in outputs)


def test_group_waits_for_all_its_seats():
    """A group is admitted only when a seat is free for each of its sequences; the seats stay reserved
    between admission and fork, so no plain request takes them."""
    engine = tiny(max_num_seqs=4, max_num_batched_tokens=8)
    engine.add_request("a", [100] * 3, SamplingParams(max_tokens=30, ignore_eos=True))
    engine.add_request("g", [200] * 20, SamplingParams(n=3, max_tokens=4, ignore_eos=True))
    engine.add_request("b", [300] * 3, SamplingParams(max_tokens=4, ignore_eos=True))
    sched = engine.scheduler
    engine.step()  # a runs; g takes the last budget tokens, reserving 2 more seats: b has none
    assert [r.request_id for r in sched.running] == ["a", "0_g"] and sched.num_reserved_seats == 2
    while "1_g" not in sched.requests:
        assert sched.num_running + sched.num_reserved_seats <= 4
        assert "b" not in {r.request_id for r in sched.running}
        engine.step()
    assert sched.num_reserved_seats == 0 and sched.num_running == 4


def test_preempted_sequence_recomputes_alone_through_the_prefix_cache():
    """A sibling preempted after the fork (FCFS: the group arrived last) frees its references alone and
    resumes from the prefix cache: its siblings still hold the prompt's blocks."""
    engine = tiny(num_blocks=30, max_num_seqs=4)
    engine.add_request("p", [300 + i for i in range(20)], SamplingParams(max_tokens=30, ignore_eos=True))
    prompt = [100 + i for i in range(33)]
    engine.add_request("g", prompt, SamplingParams(n=3, seed=5, max_tokens=20, ignore_eos=True))
    sched, preempted, resumed = engine.scheduler, set(), []
    while engine.has_unfinished():
        out = sched.schedule()
        for req in out.requests:
            if req.request_id in preempted and req.num_output_tokens and req not in resumed:
                resumed.append(req)
                assert req.num_computed_tokens >= 32  # the prompt's 8 full blocks came from the cache
        preempted |= {r.request_id for r in out.preempted}
        assert "p" not in preempted
        result = engine.executor.execute(out)
        engine.output_processor.process(sched.update(out, result.sampled, result.logprobs))
        engine.kv.pool.check_invariants()
    assert resumed and preempted <= {"0_g", "1_g", "2_g"}
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_abort_before_the_fork_frees_seats_and_blocks():
    engine = tiny(max_num_batched_tokens=8)
    engine.add_request("g", [100 + i for i in range(30)], SamplingParams(n=4, max_tokens=4))
    engine.step()  # the leader's first chunk
    assert engine.scheduler.num_reserved_seats == 3
    out = engine.abort("g")
    assert out.finished and [c.finish_reason for c in out.outputs] == ["abort"] * 4
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert engine.scheduler.num_reserved_seats == 0 and not engine.has_unfinished()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks and not engine.output_processor.groups
    assert engine.abort("g") is None


def test_abort_after_the_fork_ends_every_sequence():
    engine = tiny()
    engine.add_request("g", [100 + i for i in range(10)], SamplingParams(n=3, max_tokens=40, ignore_eos=True))
    for _ in range(4):
        engine.step()
    out = engine.abort("1_g")  # a sequence's id ends its whole group
    assert out.request_id == "g" and out.finished
    assert all(c.finish_reason == "abort" and c.token_ids for c in out.outputs)
    assert engine.kv.num_free_blocks == engine.kv.num_blocks and not engine.has_unfinished()
    engine.kv.pool.check_invariants()


def test_swap_preemption_with_groups_keeps_the_tokens():
    """Swap copies and copy-on-write copies share one ordered list: with both, seeded groups still produce
    exactly what they produce in a roomy cache."""
    prompts = [[100 + 7 * i + j for j in range(14 + 3 * i)] for i in range(4)]
    params = [SamplingParams(n=2, seed=i, max_tokens=20, ignore_eos=True) for i in range(4)]
    roomy = LLM(model="tiny", block_size=4, num_blocks=256, max_num_seqs=8).generate(prompts, params)
    llm = LLM(
        model="tiny",
        block_size=4,
        num_blocks=30,
        max_num_seqs=8,
        preemption_mode="swap",
        num_cpu_blocks=64,
        enable_prefix_caching=False,
    )
    tight = llm.generate(prompts, params)
    assert llm.engine.scheduler.swap.num_swap_outs > 0
    assert [[c.token_ids for c in o.outputs] for o in tight] == [[c.token_ids for c in o.outputs] for o in roomy]
