"""kv_cache_dtype: a KV cache narrower than the model (bf16/fp16 under an fp32 model), attention in fp32."""

import shutil

import pytest
import torch

from testbed import LLM, EngineConfig, SamplingParams

PROMPTS = [[1, 504, 3458, 314, 4649, 314], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [42] * 30]


def _run(kernel: str, kv_dtype: str):
    llm = LLM(
        model="smollm2-135m",
        kernel=kernel,
        kv_cache_dtype=kv_dtype,
        kv_cache_memory_gb=0.05,
        max_num_batched_tokens=16,  # prompts in chunks: prefill reads back the narrow cache too
    )
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    return llm.engine, [o.outputs[0].token_ids for o in outs]


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="kernel=cpu needs g++")
@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float16"])
def test_narrow_kv_cache_same_tokens_on_torch_and_cpu_kernels(kv_dtype):
    engine, cpu = _run("cpu", kv_dtype)
    k_cache = engine.executor.kv_caches[0][0]
    assert k_cache.dtype == getattr(torch, kv_dtype) and engine.dtype == torch.float32
    # the same memory budget holds twice the fp32 cache's blocks
    block_bytes = engine.arch.kv_bytes_per_token(4) * engine.config.cache.block_size
    assert engine.kv.num_blocks == int(0.05 * 2**30 // (block_bytes // 2)) >= 2 * int(0.05 * 2**30 // block_bytes)
    _, ref = _run("torch", kv_dtype)
    assert cpu == ref and all(len(t) == 12 for t in cpu)


def test_kv_cache_dtype_validation():
    with pytest.raises(ValueError, match="kv_cache_dtype must be"):
        EngineConfig(kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="not triton"):
        EngineConfig(kernel="triton", kv_cache_dtype="bfloat16")
    assert EngineConfig(kernel="cpu", kv_cache_dtype="float16").cache.dtype == "float16"
