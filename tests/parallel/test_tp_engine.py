"""Tensor parallelism on the CPU (gloo, 2 processes): the same tokens and logprobs as one rank (each rank
loading only its slices, vocabulary-parallel embedding and LM head), through prefix caching, chunked prefill,
swap preemption, speculative decoding and async scheduling; clear refusals; a dead or hung worker is a clear
error in bounded time, and the processes are cleaned up."""

import os
import signal
import time

import pytest

from testbed.config import EngineConfig
from testbed.engine import Engine
from testbed.models.arch import ModelArch
from testbed.models.registry import resolve_model
from testbed.parallel.comm import TensorParallelError
from testbed.parallel.config import check_tensor_parallel
from testbed.sampling_params import SamplingParams
from testbed.spec.base import Proposer

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # each rank one thread: 2 ranks on 2 cores

PREFIX = list(range(10, 42))  # shared by three prompts: 8 full blocks of 4 (prefix caching)
PROMPTS = [
    [1] + PREFIX + [7, 8, 9],
    [1] + PREFIX + [300, 301],
    [1] + PREFIX,
    [1, 5, 9, 13],
    [1] + list(range(500, 560)),
]


class KVWriter(Proposer):
    """A user's proposer that, like layerskip, drafts into the target's KV cache."""

    writes_target_kv = True

    def propose(self, requests, num_tokens):
        return [([], None) for _ in requests]


def run(engine: Engine, prompts, params: SamplingParams, stats=None):
    """Greedy outputs per prompt: (token ids, logprobs of the chosen tokens, error)."""
    if stats is not None:
        engine.step_callbacks.append(stats.append)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    done = {}
    deadline = time.monotonic() + 120
    while engine.has_unfinished():
        assert time.monotonic() < deadline, "engine did not finish"
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    result = []
    for i in range(len(prompts)):
        seq = done[str(i)].outputs[0]
        lps = [lp[t].logprob for t, lp in zip(seq.token_ids, seq.logprobs or [])]
        result.append((list(seq.token_ids), lps, done[str(i)].error))
    if stats is not None:
        stats.append(sum(done[str(i)].metrics.num_cached_tokens for i in range(len(prompts))))
    return result


def engine(tp: int, **kw) -> Engine:
    base = dict(model="tiny", kernel="torch", block_size=4, num_blocks=96, max_num_seqs=8, seed=3)
    base.update(kw)
    return Engine(EngineConfig(tensor_parallel_size=tp, **base))


def assert_same(ref, got):
    for (t1, l1, e1), (t2, l2, e2) in zip(ref, got):
        assert e1 is None and e2 is None
        assert t1 == t2
        assert l1 == pytest.approx(l2, abs=1e-4)


def test_tp2_matches_tp1_through_prefix_cache_chunked_prefill_and_swap_preemption():
    # 20 blocks of 4 for 5 requests growing to ~70 tokens: preemption; 16-token budget: chunked prefill;
    # an untied LM head and a vocabulary 2 ranks do not divide (the last rank's rows padded)
    kw = dict(num_blocks=40, max_num_batched_tokens=16, preemption_mode="swap", num_cpu_blocks=64)
    kw["hf_config"] = {"vocab_size": 4093, "tie_word_embeddings": False}
    params = SamplingParams(max_tokens=16, temperature=0.0, logprobs=1, ignore_eos=True)
    ref = run(engine(1, **kw), PROMPTS, params)
    stats = []
    tp = engine(2, **kw)
    try:
        got = run(tp, PROMPTS, params, stats)
    finally:
        tp.close()
    cached = stats.pop()
    assert sum(s.num_preempted for s in stats) > 0, "the test meant to preempt"
    assert any(s.num_prefill_tokens == 16 for s in stats), "the test meant to chunk prefills"
    assert cached > 0, "the test meant to hit the prefix cache"
    assert_same(ref, got)
    assert all(p.exitcode is not None for p in tp.executor.tp.procs)


@pytest.mark.parametrize(
    "spec",
    [
        {"method": "ngram", "num_speculative_tokens": 3},
        # the draft model runs whole on rank 0 (vLLM's draft_tensor_parallel_size=1)
        {"method": "draft", "model": "tiny", "num_layers": 1, "num_speculative_tokens": 2},
    ],
    ids=["ngram", "draft"],
)
def test_tp2_matches_tp1_with_speculation(spec):
    kw = dict(speculative_config=spec)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    ref = run(engine(1, **kw), PROMPTS[3:], params)
    tp = engine(2, **kw)
    try:
        got = run(tp, PROMPTS[3:], params)
        accepted = tp.spec_stats["accepted"]
    finally:
        tp.close()
    assert accepted > 0, "the test meant to accept drafts"
    assert [t for t, _, _ in got] == [t for t, _, _ in ref]


def test_tp2_matches_tp1_with_async_scheduling():
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    ref = run(engine(1), PROMPTS[3:], params)
    tp = engine(2, async_scheduling=True)
    try:
        assert tp.async_steps is not None
        got = run(tp, PROMPTS[3:], params)
    finally:
        tp.close()
    assert [t for t, _, _ in got] == [t for t, _, _ in ref]


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(kernel="cpu"), "kernel=cpu does not run under tensor parallelism"),
        (dict(speculative_config={"method": "layerskip", "num_layers": 1}), "spec.method=layerskip drafts into"),
        # refused by the property, whatever the method's name
        (dict(speculative_config={"method": f"{__name__}:KVWriter"}), f"spec.method={__name__}:KVWriter drafts into"),
        (dict(executor="host"), "executor=real or executor=sim"),
        (dict(tensor_parallel_size=0), "tensor_parallel_size must be >= 1"),
    ],
)
def test_refused_with_a_clear_error(kw, match):
    config = dict(model="tiny", kernel="torch", num_blocks=16, tensor_parallel_size=2)
    config.update(kw)
    with pytest.raises(ValueError, match=match):
        Engine(EngineConfig(**config))


def test_head_counts_the_size_does_not_divide_are_refused():
    smollm2 = ModelArch.from_hf_config(resolve_model("smollm2-135m").hf_config)  # 9 query, 3 KV heads
    check_tensor_parallel(3, smollm2, "smollm2-135m")
    with pytest.raises(ValueError, match=r"must divide the model's 9 query heads and 3 KV heads .* do: \[1, 3\]"):
        check_tensor_parallel(2, smollm2, "smollm2-135m")


@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_a_dead_or_hung_worker_is_a_clear_error_in_bounded_time(fault):
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    tp = engine(2, distributed_timeout_s=4)
    procs = tp.executor.tp.procs
    try:
        assert run(tp, PROMPTS[3:4], params)[0][2] is None  # it works first
        os.kill(procs[0].pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        start = time.monotonic()
        ((tokens, _, error),) = run(tp, PROMPTS[3:4], params)
        assert time.monotonic() - start < 4 + 10
        assert tokens == [] and "tensor-parallel group failed" in error
        assert ("rank 1 exited with code -9" if fault == "kill" else "did not finish within 4 s") in error
        # every later step fails at once, with the same error
        ((_, _, again),) = run(tp, PROMPTS[4:5], params)
        assert "tensor-parallel group failed" in again
        with pytest.raises(TensorParallelError):
            tp.executor.execute(None)
    finally:
        closing = time.monotonic()
        tp.close()
    assert all(p.exitcode is not None for p in procs)
    assert time.monotonic() - closing < 4  # a failed group's workers are killed, not waited for (5 s each)


@pytest.mark.slow
def test_smollm2_tp3_greedy_matches_tp1():
    """The real model, 3 ranks (9 query / 3 KV heads: one KV head each), gloo."""
    from testbed.llm import LLM

    prompts = ["The capital of France is", "def fibonacci(n):"]
    params = SamplingParams(max_tokens=8, temperature=0.0)
    texts = {}
    for n in (1, 3):
        llm = LLM(model="smollm2-135m", kernel="torch", tensor_parallel_size=n, num_blocks=32)
        outs = llm.generate(prompts, params)
        texts[n] = [(o.outputs[0].token_ids, o.outputs[0].text) for o in outs]
        llm.engine.close()
    assert texts[1] == texts[3]


@pytest.mark.slow
def test_torchrun_runs_the_same_code_with_env_rendezvous(tmp_path):
    """torchrun starts both ranks: rank 0 runs the experiment, rank 1 serves as its worker, both exit 0."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "run.py", "model=tiny",
               "kernel=torch", "parallel.tensor_parallel_size=2", "trace=synthetic", "trace.max_requests=4",
               "trace.output_len={dist:fixed,value:8}", "trace.prompt_len={dist:fixed,value:32}", "progress=false",
               f"hydra.run.dir={tmp_path}"]  # fmt: skip
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["completed"] == 4
