"""Async scheduling (step N+1 scheduled and prepared while step N runs) gives the synchronous engine's
tokens, through preemption, prefix hits, swap, early stops and requests that need their last token."""

import random
import threading
import time

import pytest

from testbed import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def prompts(n=12, seed=0):
    rng = random.Random(seed)
    shared = [rng.randrange(100, 4000) for _ in range(20)]
    out = [[rng.randrange(100, 4000) for _ in range(rng.randint(3, 40))] for _ in range(n // 2)]
    out += [shared + [rng.randrange(100, 4000) for _ in range(rng.randint(1, 10))] for _ in range(n - n // 2)]
    return out


def generate(async_scheduling, params, **kw):
    llm = LLM(model="tiny", kernel="torch", async_scheduling=async_scheduling, **kw)
    outs = llm.generate(prompts(), params)
    engine = llm.engine
    assert engine.kv.num_free_blocks == engine.kv.num_blocks and engine.running_step is None
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs], engine


CASES = {
    "fcfs": dict(num_blocks=400, block_size=4),
    "preempt_recompute": dict(num_blocks=40, block_size=4, max_num_seqs=8),
    "preempt_swap": dict(num_blocks=40, block_size=4, max_num_seqs=8, preemption_mode="swap", num_cpu_blocks=200),
    "sjf_small_budget": dict(num_blocks=400, block_size=4, scheduler="sjf", max_num_batched_tokens=24),
    "no_prefix_cache": dict(num_blocks=60, block_size=4, enable_prefix_caching=False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_tokens_equal_the_synchronous_engine(case):
    params = [SamplingParams(temperature=0, max_tokens=6 + 3 * (i % 5), ignore_eos=True) for i in range(12)]
    sync, _ = generate(False, params, **CASES[case])
    asynchronous, engine = generate(True, params, **CASES[case])
    assert asynchronous == sync
    assert engine.async_steps is not None and engine.step_count > 10
    if case.startswith("preempt"):
        assert engine.scheduler.num_preemptions > 0


def test_early_stops_waste_one_step_and_free_everything():
    """A stop token ends a request while its next step already runs: that step's work is dropped."""
    base = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True) for _ in range(12)]
    reference, _ = generate(False, base, num_blocks=400)
    stops = [
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop_token_ids=[ids[3]]) for ids, _ in reference
    ]
    sync, _ = generate(False, stops, num_blocks=400)
    asynchronous, _ = generate(True, stops, num_blocks=400)
    assert asynchronous == sync
    assert all(reason == "stop" for _, reason in sync)


def test_requests_needing_their_last_token_are_served_in_order():
    """Penalties and prompt logprobs need the previous token on the host: the engine finishes a step before
    scheduling the next while such a request runs, and the tokens still match the synchronous engine."""
    params = [
        SamplingParams(
            temperature=0,
            max_tokens=8,
            ignore_eos=True,
            repetition_penalty=1.3 if i % 3 == 0 else 1.0,
            prompt_logprobs=1 if i % 4 == 1 else None,
        )
        for i in range(12)
    ]
    sync, _ = generate(False, params, num_blocks=400)
    asynchronous, engine = generate(True, params, num_blocks=400)
    assert asynchronous == sync and not engine._needs_last_tokens


def test_the_next_step_is_prepared_while_this_one_runs():
    """With a device that holds each step for 30 ms, the host schedules and stages step N+1 inside step N."""
    llm = LLM(model="tiny", executor="host", host_step_time_s=0.03, async_scheduling=True, num_blocks=400)
    executor = llm.engine.executor
    runs, prepares = [], []
    run, prepare = executor.run, executor.prepare

    def timed_run(*a):
        start = time.perf_counter()
        try:
            return run(*a)
        finally:
            runs.append((start, time.perf_counter(), threading.current_thread().name))

    def timed_prepare(out):
        prepares.append(time.perf_counter())
        return prepare(out)

    executor.run, executor.prepare = timed_run, timed_prepare
    llm.generate(prompts(4), SamplingParams(max_tokens=6, ignore_eos=True))
    assert all(name.startswith("testbed-step") for *_, name in runs)
    inside = sum(any(a < p < b for a, b, _ in runs) for p in prepares)
    assert inside >= len(prepares) - 2  # all but the first steps (nothing runs yet) and the drain


def test_async_scheduling_refuses_what_it_cannot_overlap():
    with pytest.raises(ValueError, match="speculative decoding"):
        LLM(model="tiny", async_scheduling=True, speculative_config={"method": "ngram"}, num_blocks=64)
    with pytest.raises(ValueError, match="a simulation"):
        LLM(model="tiny", async_scheduling=True, executor="sim", sim_config={"device": "h100-sxm"}, num_blocks=64)
    assert LLM(model="tiny", num_blocks=64).engine.async_steps is None  # CPU default: synchronous


def test_a_failing_request_or_step_under_async_scheduling(monkeypatch):
    """Fault isolation holds with a step in flight: a request whose sampling raises ends alone with an
    error (its next step, already running, is dropped), and a forward that raises once fails only its step."""
    from testbed.executor.sampler import Sampler

    poisoned_first_token = 4001
    sample = Sampler.sample

    def poisoned_sample(self, logits, requests):
        if any(r.prompt_token_ids[0] == poisoned_first_token for r in requests):
            raise RuntimeError("poisoned sampling")
        return sample(self, logits, requests)

    params = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)] * 12
    healthy, _ = generate(False, params, num_blocks=400)
    monkeypatch.setattr(Sampler, "sample", poisoned_sample)
    llm = LLM(model="tiny", kernel="torch", async_scheduling=True, num_blocks=400)
    outs = llm.generate([*prompts(), [poisoned_first_token, 5, 6]], [*params, params[0]])
    assert [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs[:-1]] == healthy
    assert outs[-1].outputs[0].finish_reason == "error"
    engine = llm.engine
    model, calls = engine.model, []
    forward = type(model).forward

    def fails_once(self, *a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("device lost")
        return forward(self, *a, **kw)

    monkeypatch.setattr(type(model), "forward", fails_once)
    outs = llm.generate(prompts(4), params[:4])
    assert any(o.outputs[0].finish_reason == "error" for o in outs)
    again = llm.generate(prompts(4), params[:4])  # the engine keeps serving, with the right tokens
    reference = LLM(model="tiny", kernel="torch", num_blocks=400).generate(prompts(4), params[:4])
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in reference]
    assert engine.kv.num_free_blocks == engine.kv.num_blocks and engine.running_step is None


@pytest.mark.parametrize("case", ["fcfs", "preempt_recompute"])
def test_parallel_sampling_equals_the_synchronous_engine(case):
    """n seeded samples per prompt sharing the prompt's blocks (fork and copy on write one step later under
    overlap): every sequence's tokens as without overlap."""

    def run(async_scheduling):
        llm = LLM(model="tiny", kernel="torch", async_scheduling=async_scheduling, **CASES[case])
        params = [SamplingParams(n=3, temperature=1.0, seed=i, max_tokens=8, ignore_eos=True) for i in range(12)]
        outs = llm.generate(prompts(), params)
        assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
        return [[c.token_ids for c in o.outputs] for o in outs]

    sync = run(False)
    assert all(len(o) == 3 for o in sync) and any(len({tuple(t) for t in o}) > 1 for o in sync)
    assert run(True) == sync
