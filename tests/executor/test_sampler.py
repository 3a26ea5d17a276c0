"""Sampling: parameter validation, vLLM's filter order and ties, seeds, stop conditions."""

import pytest
import torch

from testbed import LLM, SamplingParams
from testbed.executor.sampler import Sampler, filter_logits
from testbed.request import Request

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def requests_for(params: list[SamplingParams], outputs=None, prompt=(1, 2, 3)) -> list[Request]:
    reqs = []
    for i, p in enumerate(params):
        r = Request(str(i), list(prompt), p, arrival_time=0.0, eos_token_ids=[0])
        for t in outputs[i] if outputs else []:
            r.append_output_token(t, None, 0.0)
        reqs.append(r)
    return reqs


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
        (dict(logprobs=21), "logprobs"),
        (dict(prompt_logprobs=21), "prompt_logprobs"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-2.1), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(min_tokens=5, max_tokens=4), "min_tokens"),
        (dict(logit_bias={"7": 1.0}), "logit_bias"),
        (dict(logit_bias={7: float("nan")}), "logit_bias"),
        (dict(bad_words=[" "]), "bad_words"),
        (dict(bad_words_token_ids=[[]]), "bad_words"),
        (dict(allowed_token_ids=[]), "allowed_token_ids"),
    ],
)
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


# ---- vLLM's order and ties (issue 11, finding 6) -----------------------------------------------------
def test_min_p_applies_before_top_p():
    """p = [.45, .35, .1, .1], top_p=.5, min_p=.5: min-p keeps {.45, .35} -> renormalised [.5625, .4375];
    top-p .5 then keeps the first alone (vLLM). Top-p first would keep both."""
    probs = torch.tensor([[0.45, 0.35, 0.1, 0.1]])
    out = filter_logits(probs.log(), [SamplingParams(top_p=0.5, min_p=0.5)])
    assert torch.isfinite(out).tolist() == [[True, False, False, False]]


def test_top_k_keeps_ties_at_the_kth_value():
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0]])
    out = filter_logits(logits, [SamplingParams(top_k=2)])
    assert torch.isfinite(out).tolist() == [[True, True, True, True, False]]


def test_top_k_keeps_only_k_tokens_without_ties():
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
    out = filter_logits(probs.log(), [SamplingParams(top_p=0.01)])  # never empty
    assert torch.isfinite(out).tolist() == [[True, False, False, False]]


def test_min_p_drops_tokens_below_fraction_of_max():
    probs = torch.tensor([[0.6, 0.25, 0.1, 0.05]])
    out = filter_logits(probs.log(), [SamplingParams(min_p=0.2)])
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]


def test_per_row_settings_do_not_leak():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]] * 3)
    out = filter_logits(probs.log(), [SamplingParams(top_k=1), SamplingParams(), SamplingParams(min_p=0.6)])
    assert torch.isfinite(out).sum(-1).tolist() == [1, 4, 2]


def test_temperature_sharpens():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    cold = filter_logits(logits, [SamplingParams(temperature=0.5)]).softmax(-1)
    assert cold[0, 0] > logits.softmax(-1)[0, 0]


def test_sampling_follows_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    sampler = Sampler(seed=1, vocab_size=3)
    reqs = requests_for([SamplingParams(temperature=1.0)] * 4000)
    tokens, _ = sampler.sample(probs.log().expand(4000, 3).clone(), reqs)
    freq = torch.bincount(torch.tensor(tokens), minlength=3).float() / 4000
    assert (freq - probs).abs().max() < 0.03


def test_filtered_sampling_follows_the_filtered_distribution():
    """top_k=2 over [.5, .3, .2]: tokens 0/1 at .625/.375, token 2 never."""
    probs = torch.tensor([0.5, 0.3, 0.2])
    reqs = requests_for([SamplingParams(temperature=1.0, top_k=2)] * 4000)
    tokens, _ = Sampler(seed=2, vocab_size=3).sample(probs.log().expand(4000, 3).clone(), reqs)
    freq = torch.bincount(torch.tensor(tokens), minlength=3).float() / 4000
    assert freq[2] == 0 and abs(freq[0] - 0.625) < 0.03


def test_seeded_rows_are_reproducible_in_any_batch():
    logits = torch.randn(1, 100)
    seeded = SamplingParams(temperature=1.0, seed=11)
    a = [Sampler(seed=0).sample(logits, requests_for([seeded]))[0][0] for _ in range(3)]
    mixed = requests_for([SamplingParams(temperature=1.0), seeded, SamplingParams(temperature=0)])
    b = Sampler(seed=5).sample(logits.expand(3, 100).clone(), mixed)[0]
    assert a[0] == a[1] == a[2] == b[1]
    assert b[2] == int(logits.argmax())


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
