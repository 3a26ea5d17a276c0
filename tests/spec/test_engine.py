"""Speculative decoding through the whole engine on small random models (fast): greedy equality for every
proposer under preemption / prefix caching / split token budgets, exact block accounting after rejections,
draft KV kept in step, and a statistical test that speculative sampling reproduces the target distribution."""

import random

import pytest
import torch

from testbed import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPECS = {
    "ngram": dict(method="ngram", num_speculative_tokens=3, prompt_lookup_max=3),
    "draft": dict(method="draft", model="tiny", num_layers=1, num_speculative_tokens=4),
    "layerskip": dict(method="layerskip", num_layers=1, num_speculative_tokens=4),
}
MODES = {
    "plain": dict(num_blocks=256, block_size=16),
    "preempt_prefix": dict(num_blocks=28, block_size=4, max_num_seqs=16),  # prefix caching is on by default
    "small_budget": dict(num_blocks=256, block_size=4, max_num_batched_tokens=6),
    "no_prefix_cache": dict(num_blocks=28, block_size=4, enable_prefix_caching=False),
}


def _prompts():
    rng = random.Random(0)
    shared = [rng.randrange(3, 4096) for _ in range(13)]
    prompts = [[rng.randrange(3, 4096) for _ in range(rng.randrange(3, 30))] for _ in range(5)]
    prompts += [shared + [rng.randrange(3, 4096) for _ in range(rng.randrange(1, 6))] for _ in range(4)]
    prompts.append([7, 8, 9, 10] * 5)
    return prompts


PROMPTS = _prompts()
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


class AccountingCheck:
    """Step callback: the pool's invariants, and every block is held by exactly the requests that need it
    (a running request holds blocks for exactly its computed tokens, nothing else holds any)."""

    def __init__(self, engine):
        self.engine = engine
        self.steps = 0
        self.partial_drafts = 0  # steps where the budget scheduled fewer drafts than proposed
        engine.step_callbacks.append(self)
        schedule = engine.scheduler.schedule

        def spy():
            out = schedule()
            for r, n, before in zip(out.requests, out.num_new_tokens, out.num_computed_tokens):
                scheduled = before + n - r.num_tokens  # drafts scheduled
                if r.spec_token_ids and scheduled < len(r.spec_token_ids):
                    self.partial_drafts += 1
            return out

        engine.scheduler.schedule = spy

    def __call__(self, stats):
        self.steps += 1
        kv, sched = self.engine.kv, self.engine.scheduler
        if kv.pool is None:  # a static contiguous allocator: its own accounting
            return
        kv.pool.check_invariants()
        running = {r.request_id: r for r in sched.running}
        held = {rid: blocks for rid, blocks in kv.req_blocks.items() if blocks}
        assert set(held) <= set(running), "a request that is not running holds blocks"
        for rid, r in running.items():
            assert len(kv.req_blocks.get(rid, ())) == kv.blocks_needed(r.num_computed_tokens), r
            assert r.num_computed_tokens <= r.num_tokens
        refs = sum(b.ref_cnt for b in kv.pool.blocks)
        assert refs == sum(len(b) for b in held.values())
        assert kv.pool.num_free_blocks == kv.num_blocks - len({b.block_id for bl in held.values() for b in bl})


def _run(spec=None, prompts=PROMPTS, params=GREEDY, waves=1, **kw):
    llm = LLM(model="tiny", speculative_config=spec, **kw)
    check = AccountingCheck(llm.engine)
    outs = []
    chunk = -(-len(prompts) // waves)
    for w in range(waves):  # later waves hit the prefix cache left by earlier ones
        outs += [o.outputs[0].token_ids for o in llm.generate(prompts[w * chunk : (w + 1) * chunk], params)]
    engine = llm.engine
    if engine.kv.pool is not None:
        engine.kv.pool.check_invariants()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    return outs, engine, check


@pytest.fixture(scope="module")
def reference():
    return _run(**MODES["plain"])[0]


def test_accounting_check_holds_without_speculation():
    _, engine, check = _run(**MODES["preempt_prefix"], waves=2)
    assert check.steps > 0 and engine.scheduler.num_preemptions > 0 and engine.spec_stats == {}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("method", list(SPECS))
def test_greedy_equal_with_speculation(method, mode, reference):
    outs, engine, check = _run(SPECS[method], waves=2, **MODES[mode])
    assert outs == reference
    stats = engine.spec_stats
    assert stats["method"] == method and stats["drafted"] > 0
    assert 0 < stats["accepted"] < stats["drafted"], "want both acceptances and rejections exercised"
    if mode == "preempt_prefix":
        assert engine.scheduler.num_preemptions > 0 and engine.kv.prefix_hits > 0
    if mode == "small_budget":
        assert check.partial_drafts > 0, "the budget should have cut some requests' drafts"


def test_draft_kv_stays_in_step():
    """The draft model with the target's weights (first layer) proposes exactly what layerskip(1) does:
    its own KV, written alongside the target's, is right after prefix hits, preemption and rewinds."""
    for mode in ("preempt_prefix", "small_budget"):
        a = _run(SPECS["layerskip"], waves=2, **MODES[mode])[1].spec_stats
        b = _run(SPECS["draft"], waves=2, **MODES[mode])[1].spec_stats
        for key in ("proposed", "drafted", "accepted", "drafted_per_position", "accepted_per_position"):
            assert a[key] == b[key], (mode, key)
    # a draft identical to the target is always right (up to float ties): its KV is never stale
    outs, engine, _ = _run(
        dict(method="draft", model="tiny", num_speculative_tokens=4), waves=2, **MODES["preempt_prefix"]
    )
    s = engine.spec_stats
    assert engine.kv.prefix_hits > 0 and engine.scheduler.num_preemptions > 0
    assert s["acceptance_rate"] > 0.99 and s["mean_accepted_length"] > 3.5


@pytest.mark.parametrize(
    "scheduler,options",
    [("fcfs", {}), ("sjf", {}), ("priority", {}), ("mlfq", {}), ("lpm", {}), ("sarathi", {"token_budget": 8})],
)
def test_greedy_equal_under_every_scheduler(scheduler, options, reference):
    for method, spec in SPECS.items():
        outs, engine, _ = _run(spec, waves=2, scheduler=scheduler, scheduler_options=options, **MODES["preempt_prefix"])
        assert outs == reference, (scheduler, method)
        assert engine.spec_stats["accepted"] > 0


@pytest.mark.parametrize("cache", ["static_max", "static_pow2", "static_oracle"])
def test_greedy_equal_with_static_allocators(cache, reference):
    for method, spec in SPECS.items():
        outs, engine, _ = _run(spec, cache=cache, num_blocks=256, block_size=4, max_model_len=64)
        assert outs == reference, (cache, method)
        assert engine.spec_stats["accepted"] > 0


def test_swap_preemption_moves_draft_kv(reference):
    """Swapped-out requests come back in other blocks: the draft model's KV must come along."""
    mode = dict(MODES["preempt_prefix"], preemption_mode="swap", num_cpu_blocks=64)
    stats = {}
    for method in ("layerskip", "draft"):
        outs, engine, _ = _run(SPECS[method], waves=2, **mode)
        assert outs == reference
        assert engine.scheduler.swap.num_swap_ins > 0
        stats[method] = engine.spec_stats
    for key in ("proposed", "drafted", "accepted"):
        assert stats["layerskip"][key] == stats["draft"][key], key


def test_drafts_respect_max_tokens_and_context():
    seen = []
    llm = LLM(
        model="tiny",
        num_blocks=64,
        block_size=4,
        max_model_len=40,
        speculative_config=dict(method="ngram", num_speculative_tokens=8),
    )
    engine = llm.engine

    def record(_):
        for r in engine.scheduler.running:
            if r.spec_token_ids:
                seen.append(r)
                assert r.num_tokens + len(r.spec_token_ids) < 40
                assert r.num_output_tokens + len(r.spec_token_ids) < r.sampling_params.max_tokens

    engine.step_callbacks.append(record)
    outs = llm.generate(
        [[7, 8, 9] * 4, [5, 6] * 12],
        [
            SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
            SamplingParams(temperature=0, max_tokens=100, ignore_eos=True),
        ],
    )
    assert seen
    assert len(outs[0].outputs[0].token_ids) == 10
    assert len(outs[1].prompt_token_ids) + len(outs[1].outputs[0].token_ids) == 40
    assert outs[1].outputs[0].finish_reason == "length"


def test_abort_and_stop_with_pending_drafts():
    llm = LLM(model="tiny", num_blocks=64, block_size=4, speculative_config=SPECS["layerskip"])
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine.add_request("a", PROMPTS[0], params)
    engine.add_request("b", PROMPTS[1], params)
    while not any(r.spec_token_ids for r in engine.scheduler.running):
        engine.step()
    engine.abort("a")
    while engine.has_unfinished():
        engine.step()
    engine.kv.pool.check_invariants()
    assert engine.kv.pool.num_free_blocks == engine.kv.num_blocks
    # a stop token inside an accepted run of drafts ends the request there
    ref = _run(prompts=[PROMPTS[-1]], **MODES["plain"])[0][0]
    stop = ref[5]
    out = LLM(model="tiny", num_blocks=64, speculative_config=SPECS["ngram"]).generate(
        [PROMPTS[-1]], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[stop])
    )
    assert out[0].outputs[0].token_ids == ref[: ref.index(stop) + 1]


def test_sampling_seeded_and_logprobs():
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, ignore_eos=True, seed=3, logprobs=0)
    for spec in SPECS.values():
        a = LLM(model="tiny", num_blocks=256, speculative_config=spec).generate(PROMPTS[:4], params)
        b = LLM(model="tiny", num_blocks=256, speculative_config=spec).generate(PROMPTS[:4], params)
        for x, y in zip(a, b):
            assert x.outputs[0].token_ids == y.outputs[0].token_ids  # same seed, same tokens
            assert len(x.outputs[0].logprobs) == len(x.outputs[0].token_ids) == 16
            # vLLM's shape: per token {token id: Logprob}, the sampled token's own entry included
            assert all(e[t].logprob <= 0 for t, e in zip(x.outputs[0].token_ids, x.outputs[0].logprobs))


# ---- the output distribution is the target's ---------------------------------------------------
def _small_vocab_model(folder, seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=16,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        initializer_range=0.3,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    target_dir = tmp_path_factory.mktemp("v16_target")
    draft_dir = tmp_path_factory.mktemp("v16_draft")
    target = _small_vocab_model(target_dir, 0)
    _small_vocab_model(draft_dir, 1)
    return target, str(target_dir), str(draft_dir)


def _exact_joint(hf_model, prompt, temperature):
    """p(t1, t2, t3 | prompt) of the target, [16, 16, 16], straight from transformers."""
    V = 16

    def next_probs(contexts):
        with torch.no_grad():
            logits = hf_model(torch.tensor(contexts)).logits[:, -1].double()
        return (logits / temperature).softmax(-1)

    p1 = next_probs([prompt])[0]
    p2 = next_probs([prompt + [a] for a in range(V)])  # [a, b]
    p3 = next_probs([prompt + [a, b] for a in range(V) for b in range(V)]).reshape(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


@pytest.mark.parametrize("method", ["layerskip", "draft", "ngram"])
def test_speculative_sampling_matches_target_distribution(method, small_vocab):
    from .test_units import chi2_pvalue

    hf_model, target_dir, draft_dir = small_vocab
    spec = {
        "layerskip": dict(method="layerskip", num_layers=1, num_speculative_tokens=2),
        "draft": dict(method="draft", model=draft_dir, num_speculative_tokens=2),  # other weights, same vocab
        "ngram": dict(method="ngram", num_speculative_tokens=2, prompt_lookup_max=2),
    }[method]
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 6, 1, 2]
    temperature, N = 0.9, 3000
    llm = LLM(
        model=target_dir, num_blocks=600, max_num_seqs=512, max_num_batched_tokens=8192, seed=7, speculative_config=spec
    )
    outs = llm.generate([prompt] * N, SamplingParams(temperature=temperature, max_tokens=4, ignore_eos=True))
    stats = llm.engine.spec_stats
    assert stats["verifications"] > N // 3 and 0.05 < stats["acceptance_rate"] < 0.95, stats
    draws = torch.tensor([o.outputs[0].token_ids[:3] for o in outs])
    counts = torch.bincount(draws[:, 0] * 256 + draws[:, 1] * 16 + draws[:, 2], minlength=16**3)
    joint = _exact_joint(hf_model, prompt, temperature).flatten()
    pval = chi2_pvalue(counts, joint)
    assert pval > 1e-3, f"{method}: chi-square p-value {pval:.2e} for the joint of the first three tokens"
    # the second and third tokens (drawn by verification) on their own, and a total-variation bound
    for pos, marginal in ((1, joint.reshape(16, 16, 16).sum((0, 2))), (2, joint.reshape(16, 16, 16).sum((0, 1)))):
        c = torch.bincount(draws[:, pos], minlength=16)
        assert chi2_pvalue(c, marginal) > 1e-3, (method, pos)
        assert 0.5 * (c / N - marginal).abs().sum() < 0.05
