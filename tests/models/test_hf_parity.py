"""The engine's greedy output must equal Hugging Face transformers' on the same weights, in every mode."""

import pytest
import torch

from testbed import LLM, SamplingParams

from .. import hf_reference

SHARED = (
    "You are a careful assistant. Answer briefly and precisely, citing the relevant facts. "
    "The user is a student preparing for an exam in European history and geography. "
)
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1, 2, 3, 4,",
    SHARED + "Question: what is the longest river in Europe?",
    SHARED + "Question: who was the first emperor of Rome?",
    SHARED + "Question: which mountain range separates Spain and France?",
    "Translate to French: The weather is nice today, and we are going to the beach.",
    "Hi",
]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return [tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def hf_model(hf_smollm2):
    return hf_smollm2  # conftest: loaded once per session


@pytest.fixture(scope="module")
def hf_greedy(hf_model, prompt_ids):
    return hf_reference.hf_greedy(hf_model, prompt_ids, MAX_TOKENS)


def _greedy(llm, prompt_ids):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompt_ids, params)]


# 9 prompts of up to ~45 tokens + 24 generated need well under 200 blocks of 4; the default cache
# (cache.memory_gb) would zero a gigabyte per engine for nothing the comparison looks at
ROOMY = 512
MODES = {
    "plain": dict(num_blocks=ROOMY),
    "small_chunks": dict(max_num_batched_tokens=16, num_blocks=ROOMY),  # prompts up to ~45 tokens: chunked
    "prefix_cache": dict(enable_prefix_caching=True, block_size=4, num_blocks=ROOMY),
    "odd_block_size": dict(block_size=5, num_blocks=ROOMY),
    "preemption": dict(block_size=4, num_blocks=40, max_num_seqs=16),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_matches_transformers(mode, prompt_ids, hf_greedy):
    llm = LLM(**MODES[mode])
    ours = _greedy(llm, prompt_ids)
    for i, (a, b) in enumerate(zip(ours, hf_greedy)):
        assert a == b, f"prompt {i} ({PROMPTS[i][:30]!r}) diverges in mode {mode}"
    engine = llm.engine
    if mode == "preemption":
        assert engine.scheduler.num_preemptions > 0, "the tiny cache should have forced preemption"
    if mode == "prefix_cache":
        assert engine.kv.prefix_hits > 0, "prompts sharing a prefix should hit the cache"
    engine.kv.pool.check_invariants()
    assert engine.kv.pool.num_free_blocks == engine.kv.num_blocks


def test_last_position_logits_match(prompt_ids, hf_model):
    llm = LLM(block_size=8, num_blocks=ROOMY)
    engine = llm.engine
    captured = {}
    original = engine.model.compute_logits

    def capture(hidden):
        logits = original(hidden)
        captured.setdefault("logits", []).append(logits.clone())
        return logits

    engine.model.compute_logits = capture
    llm.generate(prompt_ids, SamplingParams(temperature=0.0, max_tokens=1))
    ours = torch.cat(captured["logits"])  # one row per prompt, in scheduling (= submission) order
    with torch.no_grad():
        ref = torch.stack([hf_model(torch.tensor([ids])).logits[0, -1] for ids in prompt_ids])
    rel = ((ours - ref).abs().max(dim=-1).values / ref.abs().max(dim=-1).values).max().item()
    assert rel <= 1e-4, rel
