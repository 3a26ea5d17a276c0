"""Sample and prompt logprobs (vLLM's shape) equal transformers' log-softmax on the same weights."""

import math

import pytest
import torch

from testbed import LLM, SamplingParams
from testbed.executor.logprobs import Logprob, logprob_entries

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n <",
    "Once upon a time, in a small village by the sea,",
]
K = 5
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_entries_rank_and_top_k():
    lp = torch.tensor([[-0.5, -1.0, -1.0, -3.0]])
    [entry] = logprob_entries(lp, torch.tensor([2]), [1])
    # the scored token first, rank = how many tokens are at least as likely (ties: the worse rank, as vLLM)
    assert list(entry) == [2, 0]
    assert entry[2] == Logprob(-1.0, 3) and entry[0] == Logprob(-0.5, 1)
    [entry] = logprob_entries(lp, torch.tensor([0]), [1])
    assert entry == {0: Logprob(-0.5, 1)}  # the scored token is the top one: one entry
    [entry] = logprob_entries(lp, torch.tensor([3]), [0])
    assert entry == {3: Logprob(-3.0, 4)}


@pytest.fixture(scope="module")
def hf_model(hf_smollm2):
    return hf_smollm2  # conftest: loaded once per session


def hf_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row q is the log-softmax after ids[: q + 1]."""
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def check_entry(entry: dict, token: int, reference: torch.Tensor, k: int, tol: float = 2e-3):
    assert token in entry and len(entry) in (k, k + 1)
    assert math.isclose(entry[token].logprob, float(reference[token]), abs_tol=tol)
    value = reference[token]
    assert int((reference > value + tol).sum()) + 1 <= entry[token].rank <= int((reference >= value - tol).sum())
    top = reference.topk(k)
    for value, tid in zip(top.values.tolist(), top.indices.tolist()):
        if tid in entry:
            assert math.isclose(entry[tid].logprob, value, abs_tol=tol)
    got_top = sorted((e for t, e in entry.items() if e.rank <= k), key=lambda e: e.rank)
    assert len(got_top) >= k - 1  # near-ties may swap one token in or out of the top k


@pytest.fixture(scope="module")
def llm():
    """Prompts of 6-13 tokens in prefill chunks of 8: prompt logprobs are scored across chunks."""
    return LLM(model="smollm2-135m", num_blocks=64, max_model_len=512, block_size=4, max_num_batched_tokens=8)


def test_logprobs_match_transformers(llm, hf_model, tokenizer):
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    params = [
        SamplingParams(temperature=0, max_tokens=6, logprobs=K, prompt_logprobs=K, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=3, max_tokens=6, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=6, prompt_logprobs=0, ignore_eos=True),
    ]
    outs = llm.generate(prompts, params)
    for ids, p, out in zip(prompts, params, outs):
        c = out.outputs[0]
        ref = hf_logprobs(hf_model, ids + c.token_ids)
        if p.logprobs is None:
            assert c.logprobs is None
        else:
            assert len(c.logprobs) == len(c.token_ids)
            for j, (token, entry) in enumerate(zip(c.token_ids, c.logprobs)):
                check_entry(entry, token, ref[len(ids) - 1 + j], p.logprobs)
        if p.prompt_logprobs is None:
            assert out.prompt_logprobs is None
        else:
            assert len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None
            for q in range(1, len(ids)):
                check_entry(out.prompt_logprobs[q], ids[q], ref[q - 1], p.prompt_logprobs)


def test_prompt_logprobs_bypass_the_prefix_cache(llm, tokenizer):
    ids = tokenizer.encode(PROMPTS[2])
    first = llm.generate([ids], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1))[0]
    hits = llm.engine.kv.prefix_hits
    again = llm.generate([ids], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1))[0]
    assert llm.engine.kv.prefix_hits == hits  # not looked up
    assert [list(e) for e in again.prompt_logprobs[1:]] == [list(e) for e in first.prompt_logprobs[1:]]
    plain = llm.generate([ids], SamplingParams(temperature=0, max_tokens=2))[0]
    assert plain.metrics.num_cached_tokens > 0 and plain.prompt_logprobs is None
