"""End to end: kernel=cpu gives the same greedy tokens as kernel=torch on the real SmolLM2-135M, through
steps that mix decodes with prefill chunks (a small token budget) and prefix-cache hits."""

import shutil

import pytest

from testbed import LLM, SamplingParams

from ..hf_reference import hf_greedy

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


# Batch sizes for the one-call decode path (decode_layers): every decode step of a run has exactly `batch`
# rows, since all prompts are prefilled in the first step and all ask for the same number of tokens.
TOPICS = ["the sea", "mountains", "a library", "trains", "bread", "the moon", "chess", "rain"]
STARTS = ["Write one sentence about", "My favourite thing about", "Here is a short poem on", "A fact about"]
BATCH_PROMPTS = [f"{s} {t}" + ("." if (i + j) % 3 else ":") for i, s in enumerate(STARTS) for j, t in enumerate(TOPICS)]


@pytest.fixture(scope="module")
def hf_model(hf_smollm2):
    return hf_smollm2  # conftest: loaded once per session


@pytest.mark.parametrize("batch", [1, 3, *(pytest.param(b, marks=pytest.mark.slow) for b in (8, 32))])
def test_cpu_kernel_matches_transformers_at_batch_size(batch, tokenizer, hf_model):
    prompt_ids = [tokenizer.encode(p) for p in BATCH_PROMPTS[:batch]]
    # num_blocks: room for every batch here; the default cache would zero a gigabyte for nothing
    llm = LLM(model="smollm2-135m", kernel="cpu", max_num_seqs=batch, max_num_batched_tokens=2048, num_blocks=512)
    rows = []  # rows of each step that ran the one-call decode path
    backend = llm.engine.backend
    fused = backend.decode_layers

    def spy(layers, positions, hidden, *args):
        out = fused(layers, positions, hidden, *args)
        if out is not None:
            rows.append(hidden.shape[0])
        return out

    backend.decode_layers = spy
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompt_ids, params)]
    assert rows == [batch] * 15  # 16 tokens: the first from the prefill step, 15 decode steps of `batch` rows
    ref = hf_greedy(hf_model, prompt_ids, 16)
    for i in range(batch):
        assert ours[i] == ref[i], f"prompt {i} ({BATCH_PROMPTS[i]!r}) at batch {batch}"
