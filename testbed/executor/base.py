"""The one executor interface: run a SchedulerOutput, return what it sampled.

Implemented by the model runner (a real forward), the host executor (no model: host-side cost) and the
simulated executor (a cost model on a virtual clock). The SchedulerOutput carries everything an executor
needs (block-table changes, swap copies, finished ids); an executor never reads the scheduler's state.

A step is two halves: `prepare` (host work from the SchedulerOutput: block tables, staged inputs) and
`run` (the device work and sampling). `execute` is one after the other; with async scheduling the engine
prepares step N+1 while step N runs (testbed/executor/async_scheduling.py).

A failure that belongs to some requests (their sampling, prompt logprobs, verification) is reported in
`errors`, and the rest of the step is served; an executor raises only for what no request is to blame
for (input preparation, the forward), and the engine then fails every request of the step.
"""

from dataclasses import dataclass
from typing import Protocol

from testbed.core.sched_output import SchedulerOutput


@dataclass
class ExecutorOutput:
    sampled: list[list[int] | None]  # per scheduled request: new tokens (None mid-prefill)
    logprobs: list[list[dict] | None] | None = None  # per scheduled request: per new token {token id: Logprob}
    # per scheduled request: {token id: Logprob} of the prompt tokens this step scored (prompt_logprobs)
    prompt_logprobs: list[list[dict] | None] | None = None
    # request id -> why it could not be served this step (testbed.isolation): the scheduler finishes it with
    # RequestStatus.FINISHED_ERROR; its entries in the lists above mean nothing
    errors: dict[str, str] | None = None


class Executor(Protocol):
    def prepare(self, out: SchedulerOutput) -> object: ...

    def run(self, prepared, last_tokens: dict[str, int]) -> ExecutorOutput:
        """last_tokens: request id -> the token the previous step sampled (fills placeholder inputs)."""
        ...

    def execute(self, out: SchedulerOutput) -> ExecutorOutput: ...

    def close(self) -> None: ...


class StepExecutor:
    """execute = run(prepare(out)), with no step in flight."""

    def prepare(self, out: SchedulerOutput) -> object:
        raise NotImplementedError

    def run(self, prepared, last_tokens: dict[str, int]) -> ExecutorOutput:
        raise NotImplementedError

    def execute(self, out: SchedulerOutput) -> ExecutorOutput:
        return self.run(self.prepare(out), {})

    def close(self) -> None:
        """Release what outlives the executor object (processes, threads); nothing by default."""
