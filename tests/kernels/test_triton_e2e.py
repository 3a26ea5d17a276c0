"""End to end: kernel=triton gives the same greedy tokens as kernel=torch on the real SmolLM2-135M.

On a machine without CUDA the Triton kernels run on the CPU interpreter (slow), hence a small prompt
set; fp32 on every device so both backends compute the same numbers up to rounding.
"""

import pytest

from testbed import LLM, SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
]
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def prompt_ids():
    from testbed.models.smollm2 import ensure_smollm2_folder

    try:
        folder = ensure_smollm2_folder()
    except FileNotFoundError as e:  # e.g. the GPU machine, which has shape-only models
        pytest.skip(f"SmolLM2 weights unavailable: {e}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return [tokenizer.encode(p) for p in PROMPTS]


@pytest.mark.slow  # ~80 s in the CPU interpreter; the kernels alone: test_triton_backend, test_paged_*
def test_triton_matches_torch_greedy(prompt_ids):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = {}
    for kernel in ("torch", "triton"):
        # one prefill step, then decode steps: each Triton kernel runs (the interpreter costs ~1 s a layer)
        llm = LLM(
            model="smollm2-135m",
            kernel=kernel,
            dtype="float32",
            block_size=16,
            num_blocks=64,
            max_num_batched_tokens=64,
        )
        outs[kernel] = [o.outputs[0].token_ids for o in llm.generate(prompt_ids, params)]
    assert all(len(t) == MAX_TOKENS for t in outs["torch"])
    assert outs["triton"] == outs["torch"]
