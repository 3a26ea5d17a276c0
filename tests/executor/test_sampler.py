"""Sampling: parameter validation, filters, seeds, logprobs, stop conditions."""

import math

import pytest
import torch

from testbed import LLM, SamplingParams
from testbed.executor.sampler import Sampler, filter_logits


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(min_p=1.5), "min_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=-3), "max_tokens"),
        (dict(logprobs=-1), "logprobs"),
    ],
)
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_top_k_keeps_only_k_tokens():
    logits = torch.randn(3, 50)
    out = filter_logits(logits, [SamplingParams(top_k=5)] * 3)
    assert (torch.isfinite(out).sum(dim=-1) == 5).all()
    assert torch.equal(out.argmax(-1), logits.argmax(-1))


def test_top_p_keeps_smallest_set_reaching_mass():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = filter_logits(probs.log(), [SamplingParams(top_p=0.7)])
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]
    out = filter_logits(probs.log(), [SamplingParams(top_p=0.5)])
    assert torch.isfinite(out).tolist() == [[True, False, False, False]]


def test_min_p_drops_tokens_below_fraction_of_max():
    probs = torch.tensor([[0.6, 0.25, 0.1, 0.05]])
    out = filter_logits(probs.log(), [SamplingParams(min_p=0.2)])
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]


def test_temperature_sharpens():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    cold = filter_logits(logits, [SamplingParams(temperature=0.5)]).softmax(-1)
    assert cold[0, 0] > logits.softmax(-1)[0, 0]


def test_sampling_follows_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    sampler = Sampler(seed=1)
    params = [SamplingParams(temperature=1.0)] * 4000
    tokens, _ = sampler.sample(probs.log().expand(4000, 3).clone(), [str(i) for i in range(4000)], params)
    freq = torch.bincount(torch.tensor(tokens), minlength=3).float() / 4000
    assert (freq - probs).abs().max() < 0.03


@pytest.fixture(scope="module")
def tiny():
    return LLM(model="tiny", block_size=8, num_blocks=128)


def test_per_request_seed_reproduces(tiny):
    prompt = [list(range(100, 120))]
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=7, ignore_eos=True)
    a = tiny.generate(prompt, params)[0].outputs[0].token_ids
    tiny.generate(prompt, SamplingParams(temperature=1.0, max_tokens=5))  # advances the shared generator
    b = tiny.generate(prompt, params)[0].outputs[0].token_ids
    c = tiny.generate(prompt, SamplingParams(temperature=1.0, max_tokens=12, seed=8, ignore_eos=True))
    assert a == b
    assert c[0].outputs[0].token_ids != a


def test_logprobs_are_of_the_chosen_tokens(tiny):
    out = tiny.generate(
        [list(range(100, 110))], SamplingParams(temperature=0.0, max_tokens=5, logprobs=0, ignore_eos=True)
    )[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids) == 5
    assert all(lp <= 0 and math.isfinite(lp) for lp in out.logprobs)


def test_stop_token_and_max_tokens(tiny):
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    tokens = tiny.generate([list(range(100, 110))], greedy)[0].outputs[0].token_ids
    stop_at = tokens[3]
    first = tokens.index(stop_at)
    out = tiny.generate(
        [list(range(100, 110))], SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[stop_at])
    )[0].outputs[0]
    assert out.token_ids == tokens[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at
    assert tiny.generate([list(range(100, 110))], greedy)[0].outputs[0].finish_reason == "length"


def test_eos_stops_unless_ignored(tiny):
    eos = list(tiny.engine.eos_token_ids)
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    tokens = tiny.generate([list(range(100, 110))], greedy)[0].outputs[0].token_ids
    tiny.engine.eos_token_ids[:] = [tokens[2]]  # what the engine gives each new request
    try:
        req = tiny.engine.add_request("eos-test", list(range(100, 110)), SamplingParams(temperature=0.0, max_tokens=8))
        while tiny.engine.has_unfinished():
            tiny.engine.step()
        assert req.output_token_ids == tokens[: tokens.index(tokens[2]) + 1]
        assert req.status.value == "stop"
    finally:
        tiny.engine.eos_token_ids[:] = eos
