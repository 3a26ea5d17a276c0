"""Budget invariants of the scheduler, checked after every step of busy workloads."""

import random

import pytest

from testbed import LLM, SamplingParams
from testbed.request import RequestStatus


def run_checked(llm, prompts, params):
    engine = llm.engine
    sched, cfg = engine.scheduler, engine.scheduler.config
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params[i])
    finished = {}
    while engine.has_unfinished():
        out = sched.schedule()
        assert out.total_tokens <= cfg.max_num_batched_tokens
        assert sum(out.num_new_tokens) == out.total_tokens
        assert len(out.requests) <= cfg.max_num_seqs
        assert len(sched.running) <= cfg.max_num_seqs
        assert len({r.request_id for r in out.requests}) == len(out.requests), "a request scheduled twice"
        for req, n, before in zip(out.requests, out.num_new_tokens, out.num_computed_tokens):
            assert n >= 1
            assert req.status is RequestStatus.RUNNING
            assert req.num_computed_tokens == before + n  # advanced when scheduled
            assert before + n <= req.num_tokens_with_spec
            held = len(engine.kv.req_blocks[req.request_id]) * engine.kv.block_size
            assert held >= before + n, "scheduled tokens without KV slots"
        for req in out.preempted:
            assert req.status is RequestStatus.PREEMPTED and req.num_computed_tokens == 0
            assert req.request_id not in engine.kv.req_blocks
        result = engine.executor.execute(out)
        for req, _ in sched.update(out, result.sampled, result.logprobs):
            if req.is_finished:
                finished[req.request_id] = req
        engine.kv.pool.check_invariants()
    assert engine.kv.pool.num_free_blocks == engine.kv.num_blocks
    return finished


@pytest.mark.parametrize("chunk,max_seqs,num_blocks,block_size", [(16, 4, 64, 4), (7, 8, 20, 4), (64, 2, 40, 16)])
def test_budgets_hold_every_step(chunk, max_seqs, num_blocks, block_size):
    rng = random.Random(chunk)
    llm = LLM(
        model="tiny", max_num_batched_tokens=chunk, max_num_seqs=max_seqs, num_blocks=num_blocks, block_size=block_size
    )
    prompts = [[rng.randrange(100, 4000) for _ in range(rng.randrange(1, 40))] for _ in range(12)]
    params = [SamplingParams(temperature=0.0, max_tokens=rng.randrange(1, 12), ignore_eos=True) for _ in prompts]
    finished = run_checked(llm, prompts, params)
    assert len(finished) == len(prompts)
    for rid, req in finished.items():
        assert req.num_output_tokens == params[int(rid)].max_tokens


def test_preempted_requests_resume_to_the_same_tokens():
    # short prompts are all admitted, then their growth overflows the 14 blocks
    prompts = [[100 + i + j for j in range(10)] for i in range(6)]
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)] * len(prompts)
    roomy = LLM(model="tiny", block_size=4, num_blocks=256).generate(prompts, params)
    tight_llm = LLM(model="tiny", block_size=4, num_blocks=14, max_num_seqs=6)
    tight = tight_llm.generate(prompts, params)
    assert tight_llm.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in tight] == [o.outputs[0].token_ids for o in roomy]


def test_no_chunked_prefill_waits_for_budget():
    llm = LLM(model="tiny", max_num_batched_tokens=16, enable_chunked_prefill=False, num_blocks=64)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        llm.generate([list(range(100, 130))], SamplingParams(max_tokens=2))
