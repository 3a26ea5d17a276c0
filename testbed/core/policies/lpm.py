from testbed.core.policies.base import SchedulingPolicy
from testbed.request import RequestStatus


class LPMPolicy(SchedulingPolicy):
    """Longest prefix match first (SGLang's cache-aware ordering): waiting requests with more of their
    prompt already in the prefix cache go first (arrival breaks ties), so requests sharing a prefix run
    while it is cached. Like SGLang, it falls back to arrival order when more than `max_queue`
    requests wait (matching every one each step would cost more than it saves)."""

    name = "lpm"
    time_dependent = True  # the cache's contents change every step

    def __init__(self, max_queue: int = 128):
        if max_queue < 1:
            raise ValueError(f"lpm: max_queue must be >= 1, got {max_queue}")
        self.max_queue = max_queue
        self.scheduler = None

    def attach(self, scheduler):
        self.scheduler = scheduler

    def cached_prefix(self, request) -> int:
        """Tokens of the request's prompt found in the prefix cache now."""
        return self.scheduler.kv.get_computed_blocks(request)[1]

    def key(self, request, now):
        if (
            request.status is RequestStatus.RUNNING
            or self.scheduler is None
            or len(self.scheduler.waiting) > self.max_queue
        ):
            return (0, request.arrival_time, request.seq_no)
        return (-self.cached_prefix(request), request.arrival_time, request.seq_no)
