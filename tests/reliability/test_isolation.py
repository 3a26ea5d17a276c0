"""Per-request fault isolation in the engine, through the offline API (testbed.LLM).

A failure that belongs to one request (its logits processors, stop-string detection, prompt logprobs, its
speculative proposal) finishes that request with finish_reason "error" and a message; the 20 healthy
requests around it get exactly the tokens they get alone; afterwards every block is free, the pool's
invariants hold, no per-request state of the failed request is left, and the LLM keeps working. A failure
no request is to blame for (the model forward) fails that step's requests only, and what the failed step
may not have written never serves a prefix-cache hit.

The tiny model (random weights, fast steps) carries the SmolLM2 tokenizer, for stop strings."""

import pytest

from testbed import LLM, SamplingParams
from testbed.isolation import find_culprits

from .poison import INJECTIONS, MAX_TOKENS, POISON_TOKEN, healthy_params, healthy_prompts

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NGRAM = {"method": "ngram", "num_speculative_tokens": 3}


def make_llm(speculative: bool = False, **kwargs) -> LLM:
    defaults = {"model": "tiny", "tokenizer": "smollm2-135m", "num_blocks": 512, "max_num_seqs": 32}
    return LLM(**defaults | kwargs, speculative_config=NGRAM if speculative else None)


def tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def assert_clean(llm: LLM, gone_ids: list[str]) -> None:
    """After another step has run: nothing in flight, every block free, no state of the gone requests."""
    engine = llm.engine
    assert not engine.has_unfinished() and not engine.scheduler.requests
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    engine.kv.pool.check_invariants()
    sampler, executor = engine.sampler, engine.executor
    for rid in gone_ids:
        assert rid not in executor.tables.row_of
        assert rid not in sampler.generators and rid not in sampler.matchers
        assert rid not in sampler.processors.state
        assert rid not in engine.output_processor._detokenizers
        if engine.speculator:
            assert rid not in engine.speculator.draft_probs


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "speculative"])
def llm(request):
    return make_llm(request.param)


@pytest.fixture(scope="module")
def alone(llm) -> list[list[int]]:
    """Each healthy request's tokens when it runs alone."""
    return [tokens(llm.generate(p, sp))[0] for p, sp in zip(healthy_prompts(), healthy_params())]


@pytest.mark.parametrize("where", list(INJECTIONS))
def test_poisoned_request_fails_alone(llm, alone, where, monkeypatch):
    injection = INJECTIONS[where]
    if where == "proposal" and llm.engine.speculator is None:
        pytest.skip("no proposer without speculative decoding")
    injection.install(monkeypatch)
    prompts, params = healthy_prompts(), healthy_params()
    prompts.insert(10, [POISON_TOKEN, 11, 12, 13, 11, 12, 13])
    params.insert(10, injection.poisoned_params())

    outputs = llm.generate(prompts, params)
    poisoned = outputs.pop(10)
    assert poisoned.finished and poisoned.outputs[0].finish_reason == "error"
    injection.check_message(poisoned.error, speculative=llm.engine.speculator is not None)
    assert where == "stop_strings" or injection.shared_a_batch()  # decoding is per request anyway
    assert all(o.error is None for o in outputs)
    assert [o.outputs[0].finish_reason for o in outputs] == ["length"] * 20
    assert tokens(outputs) == alone

    # the LLM keeps working (with the poison still in place), and nothing of the failed request is left
    again = llm.generate(healthy_prompts(3), healthy_params(3))
    assert tokens(again) == alone[:3]
    assert_clean(llm, [poisoned.request_id])


@pytest.fixture(scope="module")
def reference() -> LLM:
    return make_llm()


def test_forward_failure_fails_its_step_only(reference, monkeypatch):
    """The forward raises once, in the first step: the requests of that step fail, the ones admitted
    later complete with the right tokens although they share a prompt prefix with the failed ones (whose
    blocks the failed step registered for prefix caching but never wrote), and so does everything after."""
    llm = make_llm(max_num_batched_tokens=128)  # the 20 prompts need several prefill steps
    shared = list(range(200, 232))  # two full blocks every prompt starts with
    prompts = [shared + [300 + i] * (4 + i % 5) for i in range(20)]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [tokens(reference.generate(p, params))[0] for p in prompts]

    model = llm.engine.model
    forward = model.forward
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(None)
        if len(calls) == 1:
            raise RuntimeError("injected forward failure")
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", failing_once)
    outputs = llm.generate(prompts, params)
    failed = [i for i, o in enumerate(outputs) if o.outputs[0].finish_reason == "error"]
    assert failed == list(range(len(failed))) and 0 < len(failed) < 20  # the first step's requests
    for i in failed:
        assert outputs[i].error == "the engine step failed: RuntimeError: injected forward failure"
        assert outputs[i].outputs[0].token_ids == []
    for i in range(len(failed), 20):
        assert outputs[i].outputs[0].finish_reason == "length"
        assert outputs[i].outputs[0].token_ids == expected[i], i

    assert tokens(llm.generate(prompts, params)) == expected
    assert_clean(llm, [outputs[i].request_id for i in failed])


def test_failed_swap_out_fails_the_requests_it_swapped(reference, monkeypatch):
    """The step whose swap-out copy fails fails its requests and the ones it swapped out (their host copy
    is not to be trusted); the others complete with the right tokens and every device and host block is
    free after."""
    # 4 running requests of up to 5 blocks each in 14 blocks: preemption; 8 more wait their turn
    llm = make_llm(num_blocks=14, max_num_seqs=4, preemption_mode="swap", num_cpu_blocks=64)
    prompts = [[400 + i] * 40 for i in range(12)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = [tokens(reference.generate(p, params))[0] for p in prompts]
    copier = llm.engine.executor.copier
    run = copier.run
    swapped_out = []

    def failing_swap_out(copies):
        if any(to_host for _, _, to_host in copies) and not swapped_out:
            swapped_out.extend(r for r in llm.engine.scheduler.waiting if llm.engine.scheduler.swap.holds(r))
            raise RuntimeError("injected copy failure")
        return run(copies)

    monkeypatch.setattr(copier, "run", failing_swap_out)
    outputs = llm.generate(prompts, params)
    assert swapped_out, "no swap-out happened: the test needs memory pressure"
    failed = {o.request_id for o in outputs if o.outputs[0].finish_reason == "error"}
    assert {r.request_id for r in swapped_out} <= failed
    for out, want in zip(outputs, expected):
        if out.request_id in failed:
            assert out.error == "the engine step failed: RuntimeError: injected copy failure"
        else:
            assert out.outputs[0].token_ids == want
    assert len(failed) < len(prompts)
    llm.generate(prompts[:1], params)  # one more step delivers the finished ids
    assert llm.engine.scheduler.swap.num_free == 64
    assert_clean(llm, sorted(failed))


def test_llm_stays_usable_when_a_step_raises(monkeypatch):
    """A failure outside every request's work (here in the scheduler's update) propagates from generate,
    and the LLM aborts what it had in flight: the next generate runs on an empty engine."""
    llm = make_llm()
    update = llm.engine.scheduler.update
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(None)
        if len(calls) == 2:
            raise RuntimeError("injected update failure")
        return update(*args, **kwargs)

    monkeypatch.setattr(llm.engine.scheduler, "update", failing_once)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with pytest.raises(RuntimeError, match="injected update failure"):
        llm.generate(healthy_prompts(4), params)
    assert not llm.engine.has_unfinished()
    outputs = llm.generate(healthy_prompts(4), params)
    assert [o.outputs[0].finish_reason for o in outputs] == ["length"] * 4
    assert_clean(llm, [])


def test_batch_failure_no_request_causes_alone_fails_the_step(monkeypatch):
    """Sampling that fails for every batch but for no request alone is not a request's fault: the whole
    step fails (each request with the message), and the engine serves the next requests."""
    from testbed.executor.sampler import Sampler

    llm = make_llm()
    sample = Sampler.sample

    def fails_in_batches(self, logits, requests):
        if len(requests) > 1:
            raise RuntimeError("batch-only failure")
        return sample(self, logits, requests)

    prompts = healthy_prompts(3)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with monkeypatch.context() as m:
        m.setattr(Sampler, "sample", fails_in_batches)
        outputs = llm.generate(prompts, params)
    assert [o.error for o in outputs] == ["the engine step failed: RuntimeError: batch-only failure"] * 3
    assert [o.outputs[0].finish_reason for o in outputs] == ["error"] * 3
    again = llm.generate(prompts, params)
    assert [o.outputs[0].finish_reason for o in again] == ["length"] * 3
    assert_clean(llm, [o.request_id for o in outputs])


def test_find_culprits():
    def run_one(key):
        if key % 3 == 0:
            raise ValueError(f"bad {key}")
        return key * 10

    batch_error = RuntimeError("batch")
    results, failed = find_culprits(run_one, range(5), batch_error, "squaring")
    assert results == {1: 10, 2: 20, 4: 40}
    assert failed == {0: "squaring failed: ValueError: bad 0", 3: "squaring failed: ValueError: bad 3"}
    with pytest.raises(RuntimeError, match="batch"):  # no key fails alone: the batch's own failure
        find_culprits(lambda key: key, range(5), batch_error, "squaring")
