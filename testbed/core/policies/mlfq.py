from testbed.core.policies.base import SchedulingPolicy


class MLFQPolicy(SchedulingPolicy):
    """FastServe's skip-join multi-level feedback queue.

    Level i has a quantum of base_quantum * 2**i decode iterations (output tokens). A new request skips
    the levels whose quantum is shorter than its first iteration (the prefill, costing one iteration
    per `prefill_tokens_per_iter` prompt tokens) and joins the first one that fits; each time it uses
    up its level's quantum it is demoted one level. Lower level first, then arrival. Preemption at
    token granularity: after any token, a waiting request of a better level displaces the worst
    running one when it cannot otherwise start (KV kept when preemption_mode=swap, as in FastServe)."""

    name = "mlfq"
    time_dependent = True  # levels change as requests generate tokens

    def __init__(
        self, num_levels: int = 8, base_quantum: int = 4, prefill_tokens_per_iter: int = 128, preempt: bool = True
    ):
        if num_levels < 1 or base_quantum < 1 or prefill_tokens_per_iter < 1:
            raise ValueError("mlfq: num_levels, base_quantum and prefill_tokens_per_iter must be >= 1")
        self.num_levels = num_levels
        self.base_quantum = base_quantum
        self.prefill_tokens_per_iter = prefill_tokens_per_iter
        self.preempt = preempt

    def quantum(self, level: int) -> int:
        return self.base_quantum << level

    def join_level(self, request) -> int:
        prefill_iters = -(-request.num_prompt_tokens // self.prefill_tokens_per_iter)
        level = 0
        while level < self.num_levels - 1 and self.quantum(level) < prefill_iters:
            level += 1
        return level

    def level(self, request) -> int:
        """Join level, demoted once per quantum used up (service = output tokens generated)."""
        level, service = self.join_level(request), request.num_output_tokens
        while level < self.num_levels - 1 and service >= self.quantum(level):
            service -= self.quantum(level)
            level += 1
        return level

    def key(self, request, now):
        return (self.level(request), request.arrival_time, request.seq_no)

    def should_preempt_for(self, waiting, running, now):
        if not self.preempt:
            return None
        return self._worse_running(waiting, running, now, self.level)
