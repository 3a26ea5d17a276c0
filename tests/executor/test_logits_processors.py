"""Penalties, logit_bias, min_tokens, bad words and allowed ids: vLLM's semantics, row by row, in one batch."""

import pytest
import torch

from testbed import LLM, SamplingParams
from testbed.executor.logits_processors import LogitsProcessors, tokenize_bad_words
from testbed.executor.sampler import Sampler

from .test_sampler import requests_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")
V = 32


def reference_penalties(logits, prompt, output, rep, freq, pres):
    """vLLM's apply_penalties for one row, written out element by element."""
    out = logits.clone()
    for t in range(len(out)):
        count = output.count(t)
        if rep != 1.0 and (t in prompt or count):
            out[t] = out[t] / rep if out[t] > 0 else out[t] * rep
        out[t] -= freq * count + pres * (count > 0)
    return out


def test_penalties_match_the_reference_and_leave_other_rows_alone():
    torch.manual_seed(0)
    logits = torch.randn(4, V) * 3
    prompt, outputs = [1, 2, 3, 30], [[5, 5, 6, 2], [7, 7, 7], [], [5, 5]]
    params = [
        SamplingParams(temperature=0, repetition_penalty=1.3),
        SamplingParams(temperature=0, frequency_penalty=0.7, presence_penalty=-0.4),
        SamplingParams(temperature=0, repetition_penalty=0.8, frequency_penalty=1.0),
        SamplingParams(temperature=0),  # no feature: untouched
    ]
    reqs = requests_for(params, outputs, prompt)
    processed = logits.clone()
    LogitsProcessors(V).apply(processed, [0, 1, 2], reqs)
    for i, p in enumerate(params):
        want = reference_penalties(
            logits[i], prompt, outputs[i], p.repetition_penalty, p.frequency_penalty, p.presence_penalty
        )
        assert torch.allclose(processed[i], want, atol=1e-6), i


def test_counts_follow_the_output_as_it_grows():
    procs = LogitsProcessors(V)
    [req] = requests_for([SamplingParams(frequency_penalty=1.0)], [[4]])
    row = torch.zeros(1, V)
    procs.apply(row, [0], [req])
    assert row[0, 4] == -1.0
    req.append_output_token(4, None, 0.0)
    req.append_output_token(9, None, 0.0)
    row = torch.zeros(1, V)
    procs.apply(row, [0], [req])
    assert row[0, 4] == -2.0 and row[0, 9] == -1.0
    procs.forget(req.request_id)
    assert not procs.state


def test_logit_bias_min_tokens_allowed_ids_and_bad_words():
    procs = LogitsProcessors(V, eos_token_ids=[0])
    params = [
        SamplingParams(logit_bias={3: 5.0, 4: -100.0}),
        SamplingParams(min_tokens=3, stop_token_ids=[9]),
        SamplingParams(min_tokens=3, stop_token_ids=[9], ignore_eos=True),
        SamplingParams(allowed_token_ids=[2, 5]),
        SamplingParams(bad_words_token_ids=[[8], [6, 7], [1, 6, 11]]),
        SamplingParams(min_tokens=1),
    ]
    outputs = [[], [1, 1], [1], [], [1, 6], [1]]
    reqs = requests_for(params, outputs)
    logits = torch.zeros(len(params), V)
    procs.apply(logits, list(range(len(params))), reqs)
    assert logits[0, 3] == 5.0 and logits[0, 4] == -100.0 and logits[0, 5] == 0.0
    assert logits[1, 0] == logits[1, 9] == float("-inf")  # 2 < 3 tokens: EOS and stop ids banned
    assert logits[2, 9] == float("-inf") and logits[2, 0] == 0.0  # ignore_eos: EOS is no stop token
    assert torch.isfinite(logits[3]).nonzero().flatten().tolist() == [2, 5]
    # [8] always, [6, 7] since the output ends with 6, [1, 6, 11] since it ends with 1, 6
    assert torch.isinf(logits[4]).nonzero().flatten().tolist() == [7, 8, 11]
    assert torch.isfinite(logits[5]).all()  # min_tokens=1 reached


def test_out_of_vocab_ids_are_refused():
    procs = LogitsProcessors(V)
    for kwargs, field in [
        (dict(logit_bias={V: 1.0}), "logit_bias"),
        (dict(allowed_token_ids=[-1]), "allowed_token_ids"),
        (dict(bad_words_token_ids=[[1, V + 5]]), "bad_words"),
    ]:
        with pytest.raises(ValueError, match=f"{field} holds token id .* outside the vocabulary") as info:
            procs.check(SamplingParams(**kwargs))
        assert info.value.param == field


def test_bad_words_tokenized_as_vllm_does(tokenizer):
    seqs = tokenize_bad_words(tokenizer, ["Paris"])
    assert tokenizer.encode("Paris", add_special_tokens=False) in seqs
    assert tokenizer.encode(" Paris", add_special_tokens=False) in seqs


def test_a_row_with_nothing_left_samples_unconstrained():
    sampler = Sampler(vocab_size=V, eos_token_ids=[0])
    [req] = requests_for([SamplingParams(temperature=0, allowed_token_ids=[0], min_tokens=2)])
    logits = torch.randn(1, V)
    tokens, _ = sampler.sample(logits, [req])
    assert tokens == [int(logits.argmax())]


@pytest.fixture(scope="module")
def llm():
    return LLM(model="smollm2-135m", num_blocks=64, max_model_len=512)


def test_through_the_engine(llm, tokenizer):
    prompt = tokenizer.encode("The capital of France is")
    plain = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0]
    first = plain.token_ids[0]
    banned = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, bad_words_token_ids=[[first]]))
    assert banned[0].outputs[0].token_ids[0] != first
    text = tokenizer.decode(plain.token_ids)
    word = text.split()[0]
    no_word = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, bad_words=[word]))[0].outputs[0]
    assert word not in no_word.text.split()[:1]
    biased = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=3, logit_bias={1000: 100.0}))
    assert biased[0].outputs[0].token_ids == [1000] * 3
    # a repetition-heavy greedy output repeats less under a frequency penalty
    count = "1, 2, 1, 2, 1, 2, 1, 2,"
    ids = tokenizer.encode(count)
    loop = llm.generate([ids], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].outputs[0]
    pen = llm.generate([ids], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, frequency_penalty=2.0))[
        0
    ].outputs[0]
    assert len(set(pen.token_ids)) > len(set(loop.token_ids))
    # min_tokens: EOS can not end the reply before 6 tokens, even where greedy would stop
    eos = tokenizer.eos_token_id
    params = SamplingParams(temperature=0, max_tokens=6, min_tokens=6, logit_bias={eos: 50.0})
    out = llm.generate([prompt], params)[0].outputs[0]
    assert len(out.token_ids) == 6 and eos not in out.token_ids
    stopped = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, logit_bias={eos: 50.0}))
    assert stopped[0].outputs[0].token_ids == [eos]


def test_engine_refuses_out_of_vocab_ids(llm):
    with pytest.raises(ValueError, match="logit_bias holds token id 99999"):
        llm.generate([[1, 2, 3]], SamplingParams(logit_bias={99999: 1.0}))
    assert not llm.engine.has_unfinished()


def test_logprobs_are_the_models_raw_ones():
    """vLLM's default logprobs_mode: the model's log-softmax, before biases, penalties and temperature."""
    sampler = Sampler(vocab_size=V)
    logits = torch.randn(2, V)
    reqs = requests_for([SamplingParams(temperature=0.5, logit_bias={3: 100.0}, logprobs=2), SamplingParams()])
    tokens, logprobs = sampler.sample(logits, reqs)
    assert tokens[0] == 3 and logprobs[1] is None
    raw = logits[0].log_softmax(-1)
    assert logprobs[0][3].logprob == pytest.approx(float(raw[3]), abs=1e-6)
    assert logprobs[0][3].rank == int((raw >= raw[3]).sum())
