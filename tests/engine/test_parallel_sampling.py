"""Parallel sampling through the engine on the tiny model: the sequences of a group compute what independent
requests compute (top-k 1 = greedy; seeded: sequence i = the request with seed + i), best_of keeps the n most
likely, outputs come in vLLM's shape, and bad values are refused with vLLM's messages."""

import pytest
import torch

from testbed import LLM, SamplingParams
from testbed.core.allocators.base import CopyKind
from testbed.sampling_params import SamplingParamError

from ..core.policies.helpers import sharpen
from ..executor.test_host_fast_paths import StepCheck

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# lengths around block boundaries (block_size 4): L - 1 a multiple of 4 or not, L a multiple of 4, L = 1
PROMPTS = [[100 + 13 * i + j for j in range(n)] for i, n in enumerate([22, 21, 20, 1, 9])]


def tiny(**kw):
    llm = LLM(**{**dict(model="tiny", block_size=4, num_blocks=256, max_model_len=256, max_num_seqs=16), **kw})
    sharpen(llm.engine)  # larger weights: outputs far from degenerate, so equalities mean something
    return llm


def token_ids(outputs):
    return [[c.token_ids for c in o.outputs] for o in outputs]


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(max_num_batched_tokens=8, enable_prefix_caching=False),  # chunked prompts, no prefix cache
        dict(num_blocks=24, max_num_seqs=6),  # preemption
    ],
)
def test_top_k_1_sequences_equal_each_other_and_greedy(kw):
    llm = tiny(**kw)
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    group = llm.generate(PROMPTS, SamplingParams(n=4, top_k=1, max_tokens=12, ignore_eos=True))
    for g, ref in zip(group, greedy):
        assert [c.index for c in g.outputs] == [0, 1, 2, 3]
        assert all(c.token_ids == ref.outputs[0].token_ids for c in g.outputs)
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


def test_seeded_sequence_i_is_the_request_with_seed_plus_i():
    llm = tiny()
    group = llm.generate(PROMPTS, SamplingParams(n=3, seed=11, max_tokens=10, ignore_eos=True))
    for i in range(3):
        single = llm.generate(PROMPTS, SamplingParams(seed=11 + i, max_tokens=10, ignore_eos=True))
        assert [g.outputs[i].token_ids for g in group] == [s.outputs[0].token_ids for s in single]
    assert len({tuple(c.token_ids) for c in group[0].outputs}) == 3  # the seeds differ, so do the samples


def test_seeded_groups_are_reproducible():
    """The same tokens in another engine, whatever its budget, cache size (preemption) or prefix caching."""
    params = SamplingParams(n=3, seed=4, max_tokens=10, ignore_eos=True)
    first = token_ids(tiny().generate(PROMPTS, params))
    assert first == token_ids(tiny().generate(PROMPTS, params))
    other = tiny(num_blocks=24, max_num_seqs=6, max_num_batched_tokens=8, enable_prefix_caching=False)
    assert first == token_ids(other.generate(PROMPTS, params))
    assert other.engine.scheduler.num_preemptions > 0


def test_best_of_returns_the_n_most_likely():
    llm = tiny()
    all4 = llm.generate(PROMPTS[:3], SamplingParams(n=4, seed=2, max_tokens=8, logprobs=0))
    best = llm.generate(PROMPTS[:3], SamplingParams(n=2, best_of=4, seed=2, max_tokens=8))
    for a, b in zip(all4, best):
        for c in a.outputs:  # the cumulative logprob sums the sampled tokens' logprobs
            assert c.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(c.token_ids, c.logprobs)))
        ranked = sorted(a.outputs, key=lambda c: c.cumulative_logprob, reverse=True)[:2]
        assert [(c.index, c.token_ids) for c in b.outputs] == [(c.index, c.token_ids) for c in ranked]
        assert all(c.logprobs is None and c.cumulative_logprob is not None for c in b.outputs)  # not asked
        assert b.outputs[0].cumulative_logprob >= b.outputs[1].cumulative_logprob


def test_step_outputs_per_sequence_then_the_group():
    """Each step gives one output per progressing sequence (the group's id, that sequence's completion,
    finished False), then one finished output with every completion and no new tokens."""
    llm = tiny()
    engine = llm.engine
    engine.add_request("g", PROMPTS[0], SamplingParams(n=3, seed=1, max_tokens=6, ignore_eos=True, logprobs=1))
    streamed, final = {0: [], 1: [], 2: []}, None
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id == "g" and final is None
            if out.finished:
                final = out
                continue
            (c,) = out.outputs
            streamed[c.index] += out.new_token_ids
    assert final.new_token_ids == [] and [c.index for c in final.outputs] == [0, 1, 2]
    for c in final.outputs:
        assert streamed[c.index] == c.token_ids and len(c.logprobs) == 6 and c.finish_reason == "length"
    assert final.metrics.first_token_time <= final.metrics.finish_time
    assert final.prompt_token_ids == PROMPTS[0]


def test_prompt_logprobs_come_from_the_one_prompt_pass():
    llm = tiny()
    single = llm.generate(PROMPTS[:2], SamplingParams(seed=0, max_tokens=3, prompt_logprobs=2))
    group = llm.generate(PROMPTS[:2], SamplingParams(n=3, seed=0, max_tokens=3, prompt_logprobs=2))
    for s, g in zip(single, group):
        assert len(g.prompt_logprobs) == len(s.prompt_logprobs) == len(s.prompt_token_ids)
        assert [e and {t: lp.logprob for t, lp in e.items()} for e in g.prompt_logprobs] == [
            e and {t: lp.logprob for t, lp in e.items()} for e in s.prompt_logprobs
        ]


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculative_decoding_with_groups(method):
    spec = {
        "ngram": dict(method="ngram", num_speculative_tokens=3, prompt_lookup_max=3),
        "draft": dict(method="draft", model="tiny", num_layers=1, num_speculative_tokens=3),
    }[method]
    prompts = PROMPTS + [[7, 8, 9, 10] * 5]
    ref = tiny().generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    llm = tiny(speculative_config=spec, num_blocks=64)
    out = llm.generate(prompts, SamplingParams(n=3, top_k=1, max_tokens=16, ignore_eos=True))
    for g, r in zip(out, ref):
        assert all(c.token_ids == r.outputs[0].token_ids for c in g.outputs)
    assert llm.engine.spec_stats["drafted"] > 0
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


# ---- bad input: vLLM's messages (vllm/sampling_params.py) --------------------------------------------------
@pytest.mark.parametrize(
    "kw, param, message",
    [
        (dict(n=0), "n", "n must be at least 1, got 0."),
        (dict(n=2, best_of=1), "best_of", "best_of must be greater than or equal to n, got n=2 and best_of=1."),
        (dict(best_of=0), "best_of", "best_of must be at least 1, got 0."),
        (dict(n=20000), "n", "n must be at most 16384, got 20000."),
        (dict(n=2, temperature=0.0), "n", "n must be 1 when using greedy sampling, got 2."),
        (dict(best_of=3, temperature=0.0), "best_of", "best_of must be 1 when using greedy sampling, got 3."),
    ],
)
def test_bad_parallel_params(kw, param, message):
    with pytest.raises(SamplingParamError) as e:
        SamplingParams(**kw)
    assert str(e.value) == message and e.value.param == param


def test_n_must_be_an_int():
    with pytest.raises(TypeError, match="n must be an int"):
        SamplingParams(n=2.0)


def test_group_that_never_fits_is_refused_naming_n():
    llm = LLM(model="tiny", block_size=4, num_blocks=64, max_model_len=256, max_num_seqs=8)
    with pytest.raises(ValueError, match=r"n=9 sequences cannot run together with max_num_seqs=8"):
        llm.generate([[100] * 5], SamplingParams(n=9))
    # 5 tokens + 60: 17 blocks each, one shared: 1 + 4 x 16 = 65 > 64
    with pytest.raises(ValueError, match=r"n=4 sequences of up to 65 tokens need 65 KV blocks of 4 together"):
        llm.generate([[100] * 5], SamplingParams(n=4, max_tokens=60))
    with pytest.raises(ValueError, match=r"best_of=4 sequences"):
        llm.generate([[100] * 5], SamplingParams(n=1, best_of=4, max_tokens=60))
    assert llm.generate([[100] * 5], SamplingParams(n=3, max_tokens=60))[0].finished
    assert not llm.engine.has_unfinished()


def test_static_allocators_refuse_groups():
    llm = LLM(model="tiny", cache="static_max", block_size=4, num_blocks=256, max_model_len=64)
    with pytest.raises(ValueError, match="n=2 needs sequences sharing KV blocks, which cache=static_max cannot"):
        llm.generate([[100] * 5], SamplingParams(n=2, max_tokens=4))


def test_copy_on_write_moves_the_kv_bytes():
    """Each copy on write reaches the executor, which copies the whole block (every layer, K and V) before
    the forward that writes into it."""
    llm = tiny()
    runner, checked = llm.engine.executor, []
    run_copies = runner.copier.run

    def run_checked(copies):
        run_copies(copies)
        for src, dst, kind in copies:
            assert kind is CopyKind.ON_DEVICE
            for layer in runner.kv_caches:
                for t in layer:
                    assert torch.equal(t[dst[0]], t[src[0]]) and t[src[0]].abs().sum() > 0
            checked.append(dst[0])

    runner.copier.run = run_checked
    llm.generate([PROMPTS[0]], SamplingParams(n=4, max_tokens=3))
    assert len(checked) == 3 == llm.engine.kv.num_cow_copies


@pytest.mark.parametrize(
    "kw",
    [
        dict(num_blocks=40, max_num_seqs=12),  # preemption, prefix hits
        dict(num_blocks=40, max_num_seqs=12, preemption_mode="swap", num_cpu_blocks=64),
        dict(num_blocks=256, max_num_batched_tokens=6, enable_prefix_caching=False),
        dict(num_blocks=64, speculative_config=dict(method="ngram", num_speculative_tokens=3, prompt_lookup_max=3)),
    ],
)
def test_host_fast_paths_hold_with_groups(kw):
    """The engine's O(1) KV accounting, persistent block tables and allocation fast path agree with their
    slow counterparts every step while groups fork, copy, get preempted and are aborted."""
    llm = tiny(**kw)
    engine = llm.engine
    check = StepCheck(engine)
    prompts = PROMPTS + [[7, 8, 9, 10] * 5]
    for i, p in enumerate(prompts):
        engine.add_request(f"g{i}", p, SamplingParams(n=3, top_k=1, max_tokens=8 + i, ignore_eos=True))
    aborted = False
    while engine.has_unfinished():
        engine.step()
        if check.steps == 6 and engine.output_processor.groups:
            engine.abort(next(iter(engine.output_processor.groups)))
            aborted = True
    assert aborted and engine.kv.num_cow_copies > 0
    assert engine.kv.num_free_blocks == engine.kv.num_blocks and engine.kv.num_held_blocks_total == 0


def test_seed_stream_past_the_largest_seed_is_refused():
    llm = LLM(model="tiny", block_size=4, num_blocks=64, max_model_len=256)
    with pytest.raises(SamplingParamError, match="sequence 2 would use seed"):
        llm.generate([[100] * 5], SamplingParams(n=3, seed=2**64 - 2))
    assert not llm.engine.has_unfinished()
