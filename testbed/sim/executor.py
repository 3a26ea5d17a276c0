"""The simulated executor: the real scheduler, KV cache and policies run unchanged; only the forward pass
is replaced, by a cost model that prices the step, on a virtual clock advanced by that price.

Sampled tokens are a fixed non-EOS token (requests end at their max_tokens, as trace replays ask).
Speculative decoding: every decoding request gets k drafts (the fixed token), each accepted with
probability `spec_acceptance`, independently (the i.i.d. acceptance model of Leviathan et al., ICML 2023),
so a step emits the accepted prefix plus one token, and the scheduler rewinds the rest as in a real run;
drafting itself is not priced, only the verification forward.

What a simulation cannot represent: output text and EOS-dependent lengths, stop strings, sampling
parameters, numerical effects (kernel and dtype choices enter only through a profile's timing), and any
time the cost model does not price (see each cost model).
"""

import random

from testbed.core.sched_output import SchedulerOutput
from testbed.executor.base import ExecutorOutput, StepExecutor
from testbed.sim.shape import StepShape


class SimExecutor(StepExecutor):
    def __init__(
        self,
        cost_model,
        clock,
        token_id: int,
        speculator=None,
        spec_acceptance: float = 0.7,
        seed: int = 0,
        recorded=None,
        copy_cost=None,
    ):
        self.cost_model = cost_model  # None: the clock replays recorded time (replay_steps)
        self.recorded = recorded  # replay_steps: testbed.sim.recorded_run.RecordedRun, checked step by step
        self.clock = clock
        self.token_id = token_id
        self.speculator = speculator
        self.spec_acceptance = spec_acceptance
        self.rng = random.Random(seed)
        self.num_steps = 0
        self.simulated_seconds = 0.0
        self.copy_cost = copy_cost  # testbed.sim.host_copies.HostCopyCost when the host KV tier is on

    def prepare(self, out: SchedulerOutput) -> SchedulerOutput:
        return out

    def run(self, out: SchedulerOutput, last_tokens: dict[str, int]) -> ExecutorOutput:
        if self.recorded is not None:
            self.recorded.check_step(self.num_steps, out)
        self.num_steps += 1
        if self.cost_model is not None:
            dt = self.cost_model.step_time(StepShape.of(out))
            if self.copy_cost is not None and out.kv_copies:
                dt += self.copy_cost.extra_time(out.kv_copies, dt)
            self.clock.advance(dt)
            self.simulated_seconds += dt
        token = self.token_id
        sampled: list[list[int] | None] = []
        for request, n, computed, known in zip(
            out.requests, out.num_new_tokens, out.num_computed_tokens, out.num_known_tokens
        ):
            num_logits = computed + n - known + 1
            if num_logits <= 0:
                sampled.append(None)  # a prefill chunk short of the prompt's end
            elif num_logits == 1:
                sampled.append([token])
            else:
                sampled.append(self._verify(request, num_logits - 1))
        return ExecutorOutput(sampled)

    @property
    def identity(self) -> dict:
        """What priced the steps (for summary.json): the cost model's identity, or the recorded run."""
        if self.cost_model is None:
            return {"cost_model": "replay_steps", "run": str(self.recorded.folder), "steps": self.num_steps}
        return {**self.cost_model.identity, "simulated_seconds": self.simulated_seconds, "steps": self.num_steps}

    def _verify(self, request, num_drafts: int) -> list[int]:
        accepted = 0
        while accepted < num_drafts and self.rng.random() < self.spec_acceptance:
            accepted += 1
        if self.speculator is not None:
            self.speculator.metrics.record(num_drafts, accepted)
        return [*request.spec_token_ids[:accepted], self.token_id]
