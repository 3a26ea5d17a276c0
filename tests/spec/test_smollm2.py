"""Greedy output with speculation equals greedy output without it, token for token, on the real
smollm2-135m, for every proposer, under preemption with prefix caching on (and a split token budget)."""

import pytest

from testbed import LLM, SamplingParams

from .test_engine import AccountingCheck

SHARED = (
    "You are a careful assistant. Answer briefly and precisely, citing the relevant facts. "
    "The user is a student preparing for an exam in European history and geography. "
)
PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "def factorial(n):",
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    SHARED + "Question: what is the longest river in Europe?",
    SHARED + "Question: who was the first emperor of Rome?",
    SHARED + "Question: which mountain range separates Spain and France?",
]
MAX_TOKENS = 16
SPECS = {
    "ngram": dict(method="ngram", num_speculative_tokens=4, prompt_lookup_max=3),
    # smollm2's first 24 layers as a separate model (own weights and KV); acceptance ~15-35% on this text
    "draft": dict(method="draft", model="smollm2-135m", num_layers=24, num_speculative_tokens=2),
    "layerskip": dict(method="layerskip", num_layers=24, num_speculative_tokens=2),
}
MODES = {
    "preempt_prefix": dict(block_size=4, num_blocks=34, max_num_seqs=16),  # prefix caching is on by default
    "small_budget": dict(block_size=16, num_blocks=128, max_num_batched_tokens=5),  # cuts drafts (k' < k)
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return [tokenizer.encode(p) for p in PROMPTS]


def _generate(prompt_ids, spec=None, **kw):
    llm = LLM(speculative_config=spec, **kw)
    check = AccountingCheck(llm.engine)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    # two waves: the second hits the prefix cache the first left behind (shared system text)
    outs = llm.generate(prompt_ids[:4], params) + llm.generate(prompt_ids[4:], params)
    engine = llm.engine
    engine.kv.pool.check_invariants()
    assert engine.kv.pool.num_free_blocks == engine.kv.num_blocks
    return [o.outputs[0].token_ids for o in outs], engine, check


@pytest.fixture(scope="module")
def reference(prompt_ids):
    return _generate(prompt_ids, num_blocks=256)[0]


CASES = [
    pytest.param(m, mode, marks=[pytest.mark.slow] if (mode == "small_budget" and m != "ngram") else [])
    for m in SPECS
    for mode in MODES
]


@pytest.mark.parametrize("method,mode", CASES)
def test_greedy_equal_on_smollm2(method, mode, prompt_ids, reference):
    outs, engine, check = _generate(prompt_ids, SPECS[method], **MODES[mode])
    for i, (a, b) in enumerate(zip(outs, reference)):
        assert a == b, f"prompt {i} ({PROMPTS[i][:30]!r}) diverges with spec={method} in mode {mode}"
    stats = engine.spec_stats
    assert stats["drafted"] > 0 and 0 < stats["accepted"] < stats["drafted"], stats
    if mode == "preempt_prefix":
        assert engine.scheduler.num_preemptions > 0, "the small cache should have forced preemption"
        assert engine.kv.prefix_hits > 0, "the second wave should hit the shared prefix"
    else:
        assert check.partial_drafts > 0
