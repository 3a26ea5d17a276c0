import zlib

from testbed.core.policies.base import SchedulingPolicy


class PriorityPolicy(SchedulingPolicy):
    """Strict priority (smaller value first, then arrival), as vLLM's `--scheduling-policy priority`.

    `preemption` says when a running request is displaced:
        memory   (default; vLLM v1) only when memory runs out for a running request: the victim is the
                 lowest-priority, latest-arriving running request. A waiting request of higher priority
                 waits for the next free seat and memory (it is first in line for both).
        waiting  (vLLM v0's priority preemption) also when the first waiting request cannot start (no
                 seat or no memory) and a running one has strictly lower priority: that one is preempted
                 for it, in any step.

    Priorities come from the request (the trace's `priority` column, `Engine.add_request(priority=)`).
    For traces without one, `high_share` marks that share of requests (chosen by a seeded hash of the
    request id, so every policy sees the same ones) one level more urgent."""

    name = "priority"
    PREEMPTION = ("memory", "waiting")

    def __init__(self, preemption: str = "memory", high_share: float = 0.0, seed: int = 0):
        if preemption not in self.PREEMPTION:
            raise ValueError(f"priority: preemption must be one of {self.PREEMPTION}, got {preemption!r}")
        if not 0.0 <= high_share <= 1.0:
            raise ValueError(f"priority: high_share must be in [0, 1], got {high_share}")
        self.preemption = preemption
        self.high_share = high_share
        self.seed = seed
        self._boost: dict[str, int] = {}

    def priority(self, request) -> int:
        if not self.high_share:
            return request.priority
        boost = self._boost.get(request.request_id)
        if boost is None:
            h = zlib.crc32(f"{self.seed}:{request.request_id}".encode()) / 2**32
            boost = self._boost[request.request_id] = int(h < self.high_share)
        return request.priority - boost

    def key(self, request, now):
        return (self.priority(request), request.arrival_time, request.seq_no)

    def should_preempt_for(self, waiting, running, now):
        if self.preemption != "waiting":
            return None
        return self._worse_running(waiting, running, now, self.priority)
