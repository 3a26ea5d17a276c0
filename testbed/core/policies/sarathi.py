from testbed.core.policies.base import SchedulingPolicy


class SarathiPolicy(SchedulingPolicy):
    """Sarathi-Serve stall-free batching (Agrawal et al., OSDI 2024): every step first gives each running
    decode its token, then fills what is left of a fixed token budget with prefill chunks (running ones
    first, then new requests, by arrival). A decode never waits behind a prefill chunk and a step never
    exceeds the budget (at most the engine's max_num_batched_tokens); memory victims are taken among
    prefills first. Deviation: the budget is a fixed token count (Sarathi-Serve derives it from a profiled
    TBT SLO)."""

    name = "sarathi"
    time_dependent = True  # a request's phase (prefill -> decode) changes its rank

    def __init__(self, token_budget: int | None = 256):
        if token_budget is not None and token_budget < 1:
            raise ValueError(f"sarathi: token_budget must be >= 1, got {token_budget}")
        self.budget = token_budget

    @staticmethod
    def is_decode(request) -> bool:
        return request.num_computed_tokens > 0 and request.num_computed_tokens >= request.num_tokens - 1

    def key(self, request, now):
        return (0 if self.is_decode(request) else 1, request.arrival_time, request.seq_no)

    def step_budget(self, default):
        return default if self.budget is None else self.budget
