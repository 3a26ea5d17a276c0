"""The policy interface: an ordering key for waiting and running requests, a victim rule, and budget hooks.

The scheduler (testbed.core.scheduler) is the one mechanism; a policy answers its questions:

    begin_step(now, waiting, live)            once per step, before the queues are sorted, given the waiting
                                              queue and the live requests (id -> Request): decide what this
                                              step's keys depend on (e.g. LPM's fallback to arrival order,
                                              MLFQ's starvation promotions)
    key(request, now)                         order of both queues (smaller first); must not read the
                                              queues themselves (CPython shows a list being sorted as
                                              empty), and is the same key insertions use within the step
    choose_victim(candidates, now)            which running request to preempt when memory runs out
    should_preempt_for(waiting, running, now) which running request the first waiting one may displace
                                              when it cannot start (no seat or no memory)
    step_budget(default)                      the step's token budget (e.g. a fixed Sarathi budget), at most
                                              the engine's max_num_batched_tokens
    token_budget(request, remaining)          tokens one request may take from what is left

A policy gets what it needs when it is built: one that reads the KV cache (cache-aware keys) sets
`needs_kv = True` and receives the allocator as `kv` from get_policy.
"""

from testbed.request import Request


class SchedulingPolicy:
    name = "base"
    # True when keys change between steps (aging, attained service, request phase, cache contents):
    # the scheduler then re-sorts both queues every step.
    time_dependent = False
    needs_kv = False  # True: built with the KV allocator (get_policy passes kv=...)

    def __init__(self, **options):
        if options:
            raise ValueError(f"scheduler {self.name!r} takes no options {sorted(options)}")

    def begin_step(self, now: float, waiting: list[Request], live: dict[str, Request]) -> None:
        """Called at the start of every step, before the queues are sorted (read them, never change them)."""

    def key(self, request: Request, now: float):
        """Smaller key = served first. Must be total (ties broken by arrival order)."""
        raise NotImplementedError

    def choose_victim(self, candidates: list[Request], now: float) -> Request:
        """Running request to preempt when blocks run out: the one served last."""
        return max(candidates, key=lambda r: self.key(r, now))

    def should_preempt_for(self, waiting: Request, running: list[Request], now: float) -> Request | None:
        """A running request that `waiting` may displace when it cannot start; None = never."""
        return None

    def step_budget(self, default: int) -> int:
        """Tokens the whole step may compute; default: the engine's max_num_batched_tokens, which also
        caps what a policy returns (a policy can only tighten the engine's limit)."""
        return default

    def token_budget(self, request: Request, remaining: int) -> int:
        """Tokens this request may take from the step's remaining budget (chunking rules)."""
        return remaining

    # helper for preemptive policies: the running request ranked last, if ranked strictly after `waiting`
    def _worse_running(self, waiting: Request, running: list[Request], now: float, rank) -> Request | None:
        if not running:
            return None
        victim = max(running, key=lambda r: self.key(r, now))
        return victim if rank(victim) > rank(waiting) else None
