"""The policy interface: an ordering key for waiting and running requests, and a victim rule."""
from testbed.request import Request


class SchedulingPolicy:
    name = "base"
    # True when keys change with time (e.g. aging): the scheduler then re-sorts every step.
    time_dependent = False

    def __init__(self, **options):
        if options:
            raise ValueError(f"scheduler {self.name!r} takes no options {sorted(options)}")

    def key(self, request: Request, now: float):
        """Smaller key = served first. Must be total (ties broken by arrival order)."""
        raise NotImplementedError

    def choose_victim(self, candidates: list[Request], now: float) -> Request:
        """Running request to preempt when blocks run out: the one served last."""
        return max(candidates, key=lambda r: self.key(r, now))

    def should_preempt_for(self, waiting: Request, running: list[Request], now: float) -> Request | None:
        """A running request to evict so that `waiting` can start (priority-style policies); None = never."""
        return None

    def token_budget(self, request: Request, remaining: int) -> int:
        """Tokens this request may take from the step's remaining budget (chunking rules)."""
        return remaining
