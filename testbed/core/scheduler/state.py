"""What every job of the scheduler shares: its limits, the KV allocator, the policy, the queues and the
counters kept as they change, and the moves between queues more than one job makes (a request inserted in
policy order, a running request preempted, a group's siblings started)."""

import bisect
from dataclasses import dataclass

from testbed.core.allocators.base import KVAllocator
from testbed.core.group_seats import GroupSeats
from testbed.core.policies import SchedulingPolicy
from testbed.core.swap import SwapManager
from testbed.request import Request, RequestStatus


@dataclass
class SchedulerLimits:
    """What bounds a step: the engine's scheduler group (testbed.config.SchedulerConfig, which checks them)
    and the model's resolved context."""

    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    enable_chunked_prefill: bool = True
    max_model_len: int = 8192


class SchedulerState:
    """The scheduler's state and the queue moves its jobs share; Scheduler (scheduler.py) is the class
    that is used, made of this, Admission (admission.py) and Finishing (finishing.py)."""

    def __init__(
        self,
        config: SchedulerLimits,
        kv: KVAllocator,
        policy: SchedulingPolicy,
        clock,
        swap: SwapManager | None = None,
    ):
        self.config = config
        self.kv = kv  # any KVAllocator (testbed.core.allocators)
        self.policy = policy
        self.clock = clock
        self.swap = swap  # None: recompute preemption
        self.waiting: list[Request] = []  # sorted by policy key
        self.running: list[Request] = []  # sorted by policy key
        self.requests: dict[str, Request] = {}
        self._next_seq_no = 0
        self._finished_ids: list[str] = []
        self.num_preemptions = 0
        self.blocked_request: Request | None = None  # waiting request refused memory in the last step
        self.seats = GroupSeats()  # parallel sampling: seats held for groups not yet forked
        # sum of num_computed_tokens over self.running, kept as they change: KV accounting in O(1)
        self.running_computed_tokens = 0
        # the policy's per-request chunking rule, or None when it is the default (take what is left)
        overridden = type(policy).token_budget is not SchedulingPolicy.token_budget
        self._token_budget = policy.token_budget if overridden else None
        # the last batch scheduled (a copy) and its ids: steady decoding schedules the same batch every step,
        # and its SchedulerOutput gets the same id list (SchedulerOutput.request_ids)
        self._last_batch: list[Request] = []
        self._last_ids: list[str] = []

    # ---- queue upkeep -------------------------------------------------------------------------
    def _insert(self, queue: list[Request], request: Request, now: float) -> None:
        key = self.policy.key
        bisect.insort(queue, request, key=lambda r: key(r, now))

    def add_request(self, request: Request) -> None:
        request.max_num_tokens = min(request.max_num_tokens, self.config.max_model_len)
        request.seq_no = self._next_seq_no
        self._next_seq_no += 1
        self.requests[request.request_id] = request
        self._insert(self.waiting, request, self.clock())

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def _preempt(self, request: Request, now: float) -> None:
        """Swap the KV out to host memory if swapping is on and it fits; otherwise recompute: drop the KV
        and start over later (prefix cache permitting)."""
        self.running.remove(request)
        self.running_computed_tokens -= request.num_computed_tokens
        self.seats.release(request)
        request.spec_token_ids = []
        if self.swap is None or not self.swap.swap_out(request):
            self.kv.free(request)
            request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._insert(self.waiting, request, now)

    # ---- parallel sampling (testbed.sequence_group) -------------------------------------------------
    @property
    def num_reserved_seats(self) -> int:
        return self.seats.reserved

    def _fork(self, leader: Request, now: float) -> None:
        """Start the siblings of a leader that has computed its prompt: each shares the KV of the prompt's first
        L - 1 tokens and computes the last one itself, for its own logits row. They take the seats the leader
        held and its place in the queue order (same arrival, same admission number)."""
        self.seats.release(leader)
        group = leader.group
        group.forked = True
        num_shared = leader.num_prompt_tokens - 1
        for sibling in group.sequences[1:]:
            sibling.seq_no = leader.seq_no
            sibling.max_num_tokens = min(sibling.max_num_tokens, self.config.max_model_len)
            self.kv.fork(leader, sibling, num_shared)
            sibling.num_computed_tokens = num_shared
            sibling.num_cached_tokens = leader.num_cached_tokens
            sibling.first_scheduled_time = leader.first_scheduled_time
            sibling.status = RequestStatus.RUNNING
            self.requests[sibling.request_id] = sibling
            self._insert(self.running, sibling, now)
            self.running_computed_tokens += num_shared
