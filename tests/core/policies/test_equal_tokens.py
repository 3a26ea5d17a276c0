"""Scheduling changes timing, never content: every policy, swap preemption, every allocator and eviction
policy gives each request the same greedy tokens as fcfs (tiny model with sharp random weights)."""

import pytest
import torch

from testbed import Engine, EngineConfig, SamplingParams

from .helpers import sharpen, workload

BASE = dict(
    model="tiny", max_model_len=256, block_size=4, num_blocks=48, max_num_batched_tokens=32, max_num_seqs=6, seed=0
)

CONFIGS = {
    "priority": dict(scheduler="priority"),
    "sjf": dict(scheduler="sjf", scheduler_options={"aging": 0.5}),
    # aging 0: ranks by size alone, so whether a preemption happens does not hang on wall-clock arrival gaps
    "sjf_preemptive": dict(scheduler="sjf", scheduler_options={"preemptive": True, "aging": 0.0}, max_num_seqs=2),
    "sarathi": dict(scheduler="sarathi", scheduler_options={"token_budget": 24}),
    "mlfq": dict(scheduler="mlfq", scheduler_options={"base_quantum": 2}, max_num_seqs=3),
    "lpm": dict(scheduler="lpm"),
    "swap": dict(preemption_mode="swap", num_cpu_blocks=64),
    "mlfq_swap": dict(
        scheduler="mlfq",
        scheduler_options={"base_quantum": 2},
        max_num_seqs=3,
        preemption_mode="swap",
        num_cpu_blocks=64,
    ),
    "static_max": dict(cache="static_max", block_size=1, num_blocks=600, max_model_len=96),
    "static_pow2": dict(cache="static_pow2", block_size=1, num_blocks=300),
    "static_oracle": dict(cache="static_oracle", block_size=3, num_blocks=80),
    "paged_bs1_lfu": dict(block_size=1, num_blocks=160, eviction="lfu"),
}
# configs whose small cache or seat limit must actually force preemption
MUST_PREEMPT = {"fcfs", "priority", "sjf_preemptive", "mlfq", "swap", "mlfq_swap"}


def run(name, **overrides):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread is faster on a shared machine
    try:
        return _run(name, **overrides)
    finally:
        torch.set_num_threads(threads)


def _run(name, **overrides):
    engine = Engine(EngineConfig.from_kwargs(**{**BASE, **overrides}))
    sharpen(engine)
    prompts, max_tokens = workload(14)
    outputs, queue = {}, list(range(len(prompts)))

    def admit(k):
        for _ in range(k):
            if queue:
                i = queue.pop(0)
                engine.add_request(
                    str(i),
                    prompts[i],
                    SamplingParams(temperature=0.0, max_tokens=max_tokens[i], ignore_eos=True),
                    priority=i % 3,
                )

    admit(5)
    while engine.has_unfinished() or queue:
        admit(1)  # staggered arrivals: later requests meet running ones
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
    assert len(outputs) == len(prompts)
    if name in MUST_PREEMPT:
        assert engine.scheduler.num_preemptions > 0, f"{name}: no preemption happened"
    if "swap" in name:
        assert engine.scheduler.swap.num_swap_ins > 0
    if engine.config.cache.name == "paged":
        engine.kv.pool.check_invariants()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    return outputs


@pytest.fixture(scope="module")
def reference():
    out = run("fcfs")
    assert len({tuple(t) for t in out.values()}) == len(out)  # diverse: a mix-up would show
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_same_greedy_tokens_as_fcfs(name, reference):
    assert run(name, **CONFIGS[name]) == reference
