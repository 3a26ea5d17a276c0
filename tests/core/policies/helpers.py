"""Helpers for the policy tests: a model-free scheduler loop on a fake clock, and a tiny model with
sharp random weights (diverse greedy tokens, so any KV mix-up changes the output)."""

import random

import torch

from testbed.core.allocators import get_allocator
from testbed.core.policies import get_policy
from testbed.core.scheduler import Scheduler, SchedulerLimits
from testbed.core.swap import SwapManager
from testbed.request import Request
from testbed.sampling_params import SamplingParams


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Sim:
    """Scheduler + allocator, no model: every scheduled request that reaches its end samples token 7."""

    def __init__(
        self,
        policy="fcfs",
        num_blocks=64,
        block_size=4,
        max_num_seqs=64,
        budget=512,
        cache="paged",
        max_model_len=1024,
        swap_blocks=None,
        eviction="lru",
        **options,
    ):
        self.clock = Clock()
        self.kv = get_allocator(cache, num_blocks, block_size, eviction=eviction, max_model_len=max_model_len)
        self.copies = []  # (src, dst, kind) of every block copy handed to the executor, in order
        swap = SwapManager(self.kv, swap_blocks) if swap_blocks else None
        self.sched = Scheduler(
            SchedulerLimits(budget, max_num_seqs, True, max_model_len),
            self.kv,
            get_policy(policy, kv=self.kv, **options),
            self.clock,
            swap,
        )
        self.pending: list[tuple[float, Request]] = []
        self.steps = []  # per step: dict(out=SchedulerOutput, decodes_before=[...])
        self.finish_order: list[str] = []

    def add(self, rid, prompt, max_tokens, at=0.0, priority=0):
        if isinstance(prompt, int):
            prompt = [100 + (hash((rid, i)) % 1000) for i in range(prompt)]
        req = Request(
            rid, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True), at, priority
        )
        self.pending.append((at, req))
        self.pending.sort(key=lambda x: x[0])
        return req

    def step(self):
        while self.pending and self.pending[0][0] <= self.clock.t:
            self.sched.add_request(self.pending.pop(0)[1])
        decodes = [r for r in self.sched.running if r.num_computed_tokens >= r.num_tokens - 1]
        out = self.sched.schedule()
        self.copies.extend(out.kv_copies)
        sampled = [  # a step reaching a request's known tokens samples one
            [7] if c + n >= known else None
            for c, n, known in zip(out.num_computed_tokens, out.num_new_tokens, out.num_known_tokens)
        ]
        self.steps.append(
            {
                "out": out,
                "decodes_before": decodes,
                "tokens": out.total_tokens,
                "ids": [r.request_id for r in out.requests],
            }
        )
        for request, _ in self.sched.update(out, sampled):
            if request.is_finished:
                self.finish_order.append(request.request_id)
        self.clock.t += 1.0
        return out

    def run(self, max_steps=5000):
        for _ in range(max_steps):
            if not self.pending and not self.sched.has_unfinished():
                return self
            self.step()
        raise AssertionError("did not finish")


SHARP_PROMPTS_SEED = 0


def sharpen(engine, seed=1, gain=2.0):
    """Redraw the tiny model's weights larger, so greedy decoding is far from degenerate."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in engine.model.named_parameters():
            if "norm" not in name:
                p.copy_((torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5 * gain).to(p.dtype))


def workload(n=12, seed=SHARP_PROMPTS_SEED):
    """Prompts of varied length (some sharing a prefix) and varied output lengths."""
    rng = random.Random(seed)
    shared = [rng.randrange(100, 4000) for _ in range(24)]
    prompts, max_tokens = [], []
    for i in range(n):
        own = [rng.randrange(100, 4000) for _ in range(rng.randrange(3, 40))]
        prompts.append(shared + own if i % 3 == 0 else own)
        max_tokens.append(rng.randrange(4, 28))
    return prompts, max_tokens
