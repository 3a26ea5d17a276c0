"""Typed, early errors on the public API (testbed.validation, SamplingParams) and sampling values that
cannot be sampled: a tiny temperature is raised to 0.01 as vLLM does, so it cannot poison a batch."""

import time

import numpy as np
import pytest

from testbed import LLM, Engine, SamplingParams
from testbed.config import EngineConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny(**kw) -> Engine:
    return Engine(EngineConfig(model="tiny", num_blocks=kw.pop("num_blocks", 256), max_num_seqs=32, **kw))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kv_cache_memory_gb": 1e6}, "host memory available"),
        ({"kv_cache_memory_gb": 0}, "kv_cache_memory_gb must be"),
        ({"kv_cache_memory_gb": float("nan")}, "kv_cache_memory_gb must be"),
        ({"max_model_len": 0}, "max_model_len must be"),
        ({"max_model_len": -3}, "max_model_len must be"),
        ({"max_model_len": 2.5}, "max_model_len:? must be"),  # a wrong type: FieldTypeError
    ],
)
def test_engine_config_refused_at_once(kwargs, match):
    start = time.monotonic()
    with pytest.raises(ValueError, match=match):
        EngineConfig(model="tiny", device="cpu", **kwargs)
    assert time.monotonic() - start < 5  # the old code hung building 1e6 GiB of blocks


def test_kv_cache_larger_than_memory_refused_before_allocating():
    start = time.monotonic()
    with pytest.raises(ValueError, match="does not fit"):
        Engine(EngineConfig(model="tiny", device="cpu", num_blocks=10**12))
    assert time.monotonic() - start < 60


def test_request_types():
    engine = tiny()
    with pytest.raises(TypeError, match="prompt_token_ids must be a list of int token ids, got str"):
        engine.add_request("a", "The capital of France is")
    with pytest.raises(TypeError, match=r"token ids must be ints, got 2.0 \(float\) at position 1"):
        engine.add_request("b", [1, 2.0, 3])
    with pytest.raises(TypeError, match="must be SamplingParams"):
        engine.add_request("c", [1, 2], {"max_tokens": 3})
    engine.add_request("d", list(np.arange(5, 9)), SamplingParams(max_tokens=2))  # numpy ints are ints
    while engine.has_unfinished():
        engine.step()
    assert not engine.scheduler.requests


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_tokens": 2.5}, TypeError, "max_tokens must be an int"),
        ({"max_tokens": 0}, ValueError, "max_tokens must be >= 1"),
        ({"temperature": float("inf")}, ValueError, "temperature must be finite"),
        ({"temperature": float("nan")}, ValueError, "temperature must be finite"),
        ({"temperature": -1e-9}, ValueError, "temperature must be finite and >= 0"),
        ({"temperature": "0.7"}, TypeError, "temperature must be a number"),
        ({"top_p": 0.0}, ValueError, "top_p must be in"),
        ({"top_p": float("nan")}, ValueError, "top_p must be in"),
        ({"top_k": 2.0}, TypeError, "top_k must be an int"),
        ({"top_k": -2}, ValueError, "top_k must be"),
        ({"min_p": 1.5}, ValueError, "min_p must be in"),
        ({"seed": 2**64}, ValueError, "seed must be in"),
        ({"seed": 1.5}, TypeError, "seed must be an int"),
        ({"stop": [""]}, ValueError, "stop strings must be non-empty"),
        ({"stop": [3]}, TypeError, "stop must be"),
        ({"stop_token_ids": [2.0]}, TypeError, "stop_token_ids must be"),
        ({"logprobs": True}, TypeError, "logprobs must be"),
    ],
)
def test_sampling_params_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        SamplingParams(**kwargs)


def test_tiny_temperature_is_raised_as_vllm_does():
    assert SamplingParams(temperature=1e-39).temperature == 0.01
    assert SamplingParams(temperature=0.005).temperature == 0.01
    assert SamplingParams(temperature=0).greedy and SamplingParams(temperature=0.0).temperature == 0
    assert SamplingParams(temperature=0.7).temperature == 0.7
    assert SamplingParams(top_k=-1).top_k == 0


def test_tiny_temperature_request_does_not_hurt_the_batch():
    """20 greedy requests and one at temperature 1e-39 in the same steps: in the old code the sampler's
    logits / 1e-39 overflowed and every request in flight failed; now all 21 finish, the greedy ones with
    the tokens they get alone, and the LLM object keeps working."""
    llm = LLM(model="tiny", num_blocks=512, max_num_seqs=32)
    prompts = [[5 + i, 17, 300 + 7 * i, 42] for i in range(20)]
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
    poisoned = SamplingParams(temperature=1e-39, max_tokens=6, ignore_eos=True, seed=3)
    outs = llm.generate([*prompts[:10], [9, 9, 9], *prompts[10:]], [greedy] * 10 + [poisoned] + [greedy] * 10)
    assert [o.outputs[0].finish_reason for o in outs] == ["length"] * 21
    together = [o.outputs[0].token_ids for i, o in enumerate(outs) if i != 10]
    assert together == alone
    llm.engine.kv.pool.check_invariants()
    assert llm.engine.kv.pool.num_free_blocks == llm.engine.kv.num_blocks
    assert llm.generate([[1, 2, 3]], greedy)[0].outputs[0].finish_reason == "length"
