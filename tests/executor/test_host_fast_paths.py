"""The engine's host-side fast paths against the slow ways they replace, checked every step of busy
workloads (preemption, prefix hits, swap, speculative rejections, aborts, chunked prefill, static
allocators): KV stats from counters == the full per-request accounting, the scheduler's running token
sum, the persistent block tables == the allocator's block lists, the stop-token filter == checking every
token, and lazily built outputs == the request's state at the step that returned them."""

import copy
import random

import numpy as np
import pytest

from testbed import LLM, SamplingParams
from testbed.core.allocators.base import final_length
from testbed.core.allocators.paged import PagedAllocator
from testbed.core.policies import get_policy
from testbed.core.scheduler import Scheduler, SchedulerLimits
from testbed.request import Request
from testbed.stopping import append_until_stop, check_token_stop

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _prompts(n=10, seed=0):
    rng = random.Random(seed)
    shared = [rng.randrange(3, 4096) for _ in range(13)]
    prompts = [[rng.randrange(3, 4096) for _ in range(rng.randrange(3, 30))] for _ in range(n // 2)]
    prompts += [shared + [rng.randrange(3, 4096) for _ in range(rng.randrange(1, 6))] for _ in range(n // 2 - 1)]
    prompts.append([7, 8, 9, 10] * 5)  # repetitive: ngram drafts
    return prompts


class StepCheck:
    """Step callback: every fast path equals its slow counterpart right now."""

    def __init__(self, engine):
        self.engine = engine
        self.steps = 0
        engine.step_callbacks.append(self)

    def __call__(self, stats):
        self.steps += 1
        engine = self.engine
        sched, kv = engine.scheduler, engine.kv
        running = sched.running
        assert sched.running_computed_tokens == sum(r.num_computed_tokens for r in running)
        full = kv.stats(
            {r.request_id: r.num_computed_tokens for r in running},
            {r.request_id: final_length(r, engine.max_model_len) for r in running},
            sched.blocked_request,
        )
        assert stats.kv == full, (stats.kv, full)
        if isinstance(kv, PagedAllocator):
            assert kv.num_held_blocks_total == sum(len(b) for b in kv.req_blocks.values())
            bs = kv.block_size
            for rid, limit in kv.req_fast_limit.items():  # the no-op window of allocate_slots is sound
                assert limit <= len(kv.req_blocks[rid]) * bs
                if kv.enable_prefix_caching:
                    assert limit < (kv.req_num_hashed.get(rid, 0) + 1) * bs
        self.check_tables()
        self.check_staged_tables(stats)

    def check_staged_tables(self, stats):
        """The block tables the step ran with (staged incrementally: rows unchanged since a buffer set last
        held them are not rewritten) == a full gather of the executor's rows for the step's batch."""
        executor = self.engine.executor
        tables, inputs = executor.tables, executor.last_inputs
        staged = inputs.meta.block_tables.numpy()
        rows = [tables.row_of[rid] for rid in stats.scheduled_ids]
        assert staged.shape[0] == len(rows)
        assert (staged == tables.table[rows, : staged.shape[1]]).all()

    def check_tables(self):
        """The executor's persistent rows, with the changes the next SchedulerOutput will carry applied,
        hold every block a running request has (applied to a copy: the engine's rows are untouched)."""
        kv, scheduler = self.engine.kv, self.engine.scheduler
        tables = copy.deepcopy(self.engine.executor.tables)
        pending = {rid: (first, kv.get_block_ids(rid)[first:]) for rid, first in kv._block_changes.items()}
        tables.apply(scheduler._finished_ids, pending)
        ids = [r.request_id for r in scheduler.running]
        rows = tables.rows(ids)
        assert not set(tables.row_of) & set(scheduler._finished_ids)
        for rid, row in zip(ids, rows):
            block_ids = kv.get_block_ids(rid)
            assert tables.table[row, : len(block_ids)].tolist() == block_ids, rid


MODES = {
    "preempt_prefix": dict(num_blocks=28, block_size=4, max_num_seqs=16),
    "small_budget": dict(num_blocks=256, block_size=4, max_num_batched_tokens=6),
    "no_prefix_cache": dict(num_blocks=28, block_size=4, enable_prefix_caching=False),
    "swap": dict(num_blocks=28, block_size=4, max_num_seqs=16, preemption_mode="swap", num_cpu_blocks=64),
    "spec_ngram": dict(
        num_blocks=40,
        block_size=2,
        max_num_seqs=16,
        speculative_config=dict(method="ngram", num_speculative_tokens=3, prompt_lookup_max=3),
    ),
    "spec_layerskip": dict(
        num_blocks=64,
        block_size=4,
        max_num_batched_tokens=8,
        speculative_config=dict(method="layerskip", num_layers=1, num_speculative_tokens=4),
    ),
    "static_oracle": dict(num_blocks=256, block_size=4, cache="static_oracle", max_model_len=64),
    "mlfq": dict(num_blocks=28, block_size=4, scheduler="mlfq"),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_fast_paths_match_slow_ones_every_step(mode):
    llm = LLM(model="tiny", **MODES[mode])
    engine = llm.engine
    check = StepCheck(engine)
    prompts = _prompts()
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    llm.generate(prompts[:5], params)  # a first wave leaves cached prefixes
    for i, p in enumerate(prompts):
        engine.add_request(f"b{i}", p, SamplingParams(temperature=0, max_tokens=5 + i, ignore_eos=True))
    aborted = 0
    while engine.has_unfinished():
        engine.step()
        if check.steps % 7 == 3 and engine.scheduler.running:  # aborts while running, mid-prefill or decoding
            engine.abort(engine.scheduler.running[-1].request_id)
            aborted += 1
    assert check.steps > 20 and aborted > 0
    assert engine.scheduler.running_computed_tokens == 0
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    if isinstance(engine.kv, PagedAllocator):
        assert engine.kv.num_held_blocks_total == 0 and engine.kv.num_internal_slots == 0
    if mode in ("preempt_prefix", "swap", "spec_ngram", "no_prefix_cache"):
        assert engine.scheduler.num_preemptions > 0
    if mode.startswith("spec"):
        stats = engine.spec_stats
        assert 0 < stats["accepted"] < stats["drafted"], "want rejections (trims) exercised"


# ---- stop checks ---------------------------------------------------------------------------------------
def _reference_append(sched, request, tokens, now):
    """What update did before the filter: _check_stop after every token."""
    appended = []
    for token in tokens:
        request.append_output_token(token, None, now)
        appended.append(token)
        if check_token_stop(request, token, sched.config.max_model_len):
            break
    return appended


def test_stop_filter_equals_checking_every_token():
    rng = random.Random(0)
    for _ in range(400):
        max_model_len = rng.randrange(8, 40)
        sched = Scheduler(
            SchedulerLimits(max_model_len=max_model_len), PagedAllocator(64, 4), get_policy("fcfs"), clock=lambda: 0.0
        )
        params = SamplingParams(
            max_tokens=rng.choice([None, 1, 3, 10, 50]),
            ignore_eos=rng.random() < 0.5,
            stop_token_ids=rng.sample(range(6), rng.randrange(3)),
        )
        prompt, eos = [9] * rng.randrange(1, max_model_len), [rng.randrange(6)]
        a, b = (Request("r", prompt, params, 0.0, eos_token_ids=eos) for _ in range(2))
        sched.add_request(a)
        while not a.is_finished:
            tokens = [rng.randrange(8) for _ in range(rng.choice([1, 1, 3]))]
            got = append_until_stop(a, tokens, None, 0.0, max_model_len)
            want = _reference_append(sched, b, tokens, 0.0)
            assert got == want
            assert (a.status, a.stop_reason, a.output_token_ids) == (b.status, b.stop_reason, b.output_token_ids)
            if not b.is_finished:
                assert a.num_tokens < max_model_len


# ---- outputs -------------------------------------------------------------------------------------------
def test_outputs_read_later_show_their_own_step():
    """Outputs are built lazily from the request; reading one after later steps (more tokens, preemption,
    finishing) must still give what the request was at the step that returned it."""
    llm = LLM(model="tiny", num_blocks=20, block_size=4, max_num_seqs=8)
    engine = llm.engine
    params = [
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0 if i % 2 else None) for i in range(8)
    ]
    requests = {str(i): engine.add_request(str(i), p, params[i]) for i, p in enumerate(_prompts(8))}
    held, expected = [], []
    while engine.has_unfinished():
        for out in engine.step():
            r = requests[out.request_id]
            expected.append(
                (
                    out.request_id,
                    out.finished,
                    list(r.output_token_ids),
                    list(r.output_logprobs) if r.sampling_params.logprobs is not None else None,
                    r.status.value if r.is_finished else None,
                    r.num_preemptions,
                    r.finish_time if r.is_finished else None,
                    r.first_token_time,
                )
            )
            held.append(out)
    assert engine.scheduler.num_preemptions > 0
    for out, want in zip(held, expected):
        c, m = out.outputs[0], out.metrics
        got = (
            out.request_id,
            out.finished,
            c.token_ids,
            c.logprobs,
            c.finish_reason,
            m.num_preemptions,
            m.finish_time,
            m.first_token_time,
        )
        assert got == want
        assert out.new_token_ids == c.token_ids[-len(out.new_token_ids) :]


def test_output_objects_behave_like_data():
    from testbed.outputs import CompletionOutput, RequestMetrics, RequestOutput

    c = CompletionOutput(0, "hi", [1, 2], None, "stop", 2)
    assert c == CompletionOutput(0, "hi", [1, 2], None, "stop", 2) and c != CompletionOutput(0, "hi", [1], None)
    c.token_ids = [5]
    assert c.token_ids == [5] and "token_ids=[5]" in repr(c)
    m = RequestMetrics(0.0, 1.0, 2.0, 3.0, [2.0], 0, 0)
    out = RequestOutput("a", [1], [c], True, [5], m)
    assert out.outputs == [c] and out.metrics is m and out.new_token_ids == [5] and "request_id='a'" in repr(out)
    out.prompt = "x"
    assert RequestOutput("b", [1], [c], False).new_token_ids == []
    grow = [1, 2, 3]
    snap = CompletionOutput.prefix_of(0, "", grow, 2, None, None, None, None)
    grow.append(4)
    assert snap.token_ids == [1, 2] and np.array_equal(snap.token_ids, [1, 2])
