"""SchedulerOutput: one step's work, the plain-data contract between the scheduler and an executor (as
vLLM v1's vllm/v1/core/sched/output.py). An executor reads only this, never the scheduler's or the
allocator's state, so any executor (real, null, simulated, a TP worker) runs the same scheduler."""

from dataclasses import dataclass, field

from testbed.core.allocators.base import KVCopy
from testbed.request import Request


@dataclass
class SchedulerOutput:
    """One step's work: everything an executor needs, pushed forward (it never reads the scheduler's or
    the allocator's state). The three change lists cover what happened since the last non-empty output."""

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # aligned with requests
    # aligned with requests, as they were before this step: tokens with KV, and tokens known (prompt +
    # outputs, counting an output still being sampled by an earlier step in flight; drafts excluded)
    num_computed_tokens: list[int] = field(default_factory=list)
    num_known_tokens: list[int] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    preempted: list[Request] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)  # finished: executors drop their per-request state
    # request id -> (first changed position, block ids from there on): apply to the persistent block tables
    block_updates: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    kv_copies: list[KVCopy] = field(default_factory=list)  # block copies (swap, copy on write), run in order first
    # the requests' ids, aligned with requests: see request_ids
    ids: list[str] | None = field(default=None, repr=False, compare=False)

    @property
    def request_ids(self) -> list[str]:
        """The scheduled requests' ids in batch order, built once. The scheduler hands on the last step's
        list while the batch stays the same, so it may be shared between steps: read it, never change it."""
        if self.ids is None:
            self.ids = [r.request_id for r in self.requests]
        return self.ids

    @property
    def total_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_empty(self) -> bool:
        return not self.requests
