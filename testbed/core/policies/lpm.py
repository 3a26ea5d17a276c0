from testbed.core.policies.base import SchedulingPolicy
from testbed.request import RequestStatus


class LPMPolicy(SchedulingPolicy):
    """Longest prefix match first, after SGLang's cache-aware scheduling (RadixAttention paper, Zheng et al.
    2024, Sec. 4; `schedule_policy.py`): waiting requests with more of their prompt already in the prefix
    cache go first (arrival breaks ties), so requests sharing a prefix run while it is cached.

    Like SGLang, it falls back to arrival order when more than `max_queue` requests wait (matching every
    one each step would cost more than it saves). The choice is made once per step in `begin_step`, before
    the queues are sorted, and insertions within the step use the same key. Deviations from SGLang: the
    match is against our block-granular prefix cache (full blocks only) rather than a token radix tree,
    and running requests keep arrival order (SGLang orders only its waiting queue too)."""

    name = "lpm"
    time_dependent = True  # the cache's contents change every step (off while in steady arrival order)

    needs_kv = True

    def __init__(self, kv, max_queue: int = 128):
        if max_queue < 1:
            raise ValueError(f"lpm: max_queue must be >= 1, got {max_queue}")
        self.kv = kv  # the prefix cache whose contents order the queue
        self.max_queue = max_queue
        self.by_prefix = True  # this step's ordering: longest prefix (True) or arrival (False)

    def begin_step(self, now, waiting, live):
        by_prefix = len(waiting) <= self.max_queue
        # re-sort when keys depend on the cache, or once when the ordering switches back to arrival
        self.time_dependent = by_prefix or by_prefix != self.by_prefix
        self.by_prefix = by_prefix

    def cached_prefix(self, request) -> int:
        """Tokens of the request's prompt found in the prefix cache now."""
        return self.kv.get_computed_blocks(request)[1]

    def key(self, request, now):
        if not self.by_prefix or request.status is RequestStatus.RUNNING:
            return (0, request.arrival_time, request.seq_no)
        return (-self.cached_prefix(request), request.arrival_time, request.seq_no)
