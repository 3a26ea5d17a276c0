import zlib

from testbed.core.policies.base import SchedulingPolicy


class PriorityPolicy(SchedulingPolicy):
    """Strict priority (smaller value first, then arrival): a waiting request displaces the lowest-priority
    running one when it cannot otherwise start, and memory victims are taken lowest priority first.

    Priorities come from the request (the trace's `priority` column, `Engine.add_request(priority=)`).
    For traces without one, `high_share` marks that share of requests (chosen by a seeded hash of the
    request id, so every policy sees the same ones) one level more urgent."""

    name = "priority"

    def __init__(self, preempt: bool = True, high_share: float = 0.0, seed: int = 0):
        if not 0.0 <= high_share <= 1.0:
            raise ValueError(f"priority: high_share must be in [0, 1], got {high_share}")
        self.preempt = preempt
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
        if not self.preempt:
            return None
        return self._worse_running(waiting, running, now, self.priority)
