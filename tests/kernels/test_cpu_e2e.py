"""End to end: kernel=cpu gives the same greedy tokens as kernel=torch on the real SmolLM2-135M, through
steps that mix decodes with prefill chunks (a small token budget) and prefix-cache hits."""

import shutil

import pytest

from testbed import LLM, SamplingParams

pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None,
    reason="kernel=cpu builds its kernels with a C++ compiler",
)

SHARED = "You are a helpful assistant. Answer briefly and precisely, and never make up facts. "
PROMPTS = [
    SHARED + "The capital of France is",
    "def fibonacci(n):\n    ",
    SHARED + "Once upon a time, in a small village by the sea, there lived",
    "1, 2, 3, 4,",
]


def test_cpu_kernel_matches_torch_greedy(tokenizer):
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = {}
    for kernel in ("torch", "cpu"):
        llm = LLM(
            model="smollm2-135m",
            kernel=kernel,
            dtype="float32",
            block_size=16,
            num_blocks=128,
            max_num_batched_tokens=24,
            enable_prefix_caching=True,
        )
        outs[kernel] = [o.outputs[0].token_ids for o in llm.generate(prompt_ids, params)]
    assert all(len(t) == 24 for t in outs["torch"])
    assert outs["cpu"] == outs["torch"]
