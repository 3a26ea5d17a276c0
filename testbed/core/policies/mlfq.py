from testbed.core.policies.base import SchedulingPolicy
from testbed.request import RequestStatus


class MLFQPolicy(SchedulingPolicy):
    """FastServe's skip-join multi-level feedback queue (Wu et al. 2023, "Fast Distributed Inference
    Serving for Large Language Models", Sec. 4.1-4.2).

    Level i has a quantum of base_quantum * 2**i decode iterations (output tokens). A new request skips
    the levels whose quantum is shorter than its first iteration (the prefill, costing one iteration
    per `prefill_tokens_per_iter` prompt tokens) and joins the first one that fits; each time it uses
    up its level's quantum it is demoted one level. Lower level first, then arrival. Preemption at
    token granularity: after any token, a waiting request of a better level displaces the worst
    running one when it cannot otherwise start.

    Starvation: as in FastServe, a request that has waited longer than `starve_limit_s` (scheduler-clock
    seconds since its last output token, or since arrival) is promoted to the top level, and its
    quantum accounting restarts there; None turns promotion off (then long jobs can starve under load).

    Deviations from FastServe: the prefill's cost in iterations is a fixed token ratio
    (`prefill_tokens_per_iter`) rather than FastServe's profiled iteration time; the quantum counts
    output tokens, not wall time; preempted KV goes to host memory only when the run uses
    `preemption_mode=swap` (conf/scheduler/mlfq.yaml makes swap the default, as FastServe keeps
    preempted KV in host memory; FastServe's proactive swap-in is not modelled) and is otherwise
    recomputed."""

    name = "mlfq"
    time_dependent = True  # levels change as requests generate tokens

    def __init__(
        self,
        num_levels: int = 8,
        base_quantum: int = 4,
        prefill_tokens_per_iter: int = 128,
        preempt: bool = True,
        starve_limit_s: float | None = 1.0,
    ):
        if num_levels < 1 or base_quantum < 1 or prefill_tokens_per_iter < 1:
            raise ValueError("mlfq: num_levels, base_quantum and prefill_tokens_per_iter must be >= 1")
        if starve_limit_s is not None and not starve_limit_s > 0:
            raise ValueError(f"mlfq: starve_limit_s must be > 0 or null, got {starve_limit_s}")
        self.num_levels = num_levels
        self.base_quantum = base_quantum
        self.prefill_tokens_per_iter = prefill_tokens_per_iter
        self.preempt = preempt
        self.starve_limit_s = starve_limit_s
        # request id -> output tokens it had when last promoted: service counts from there, from level 0
        self.promoted_at: dict[str, int] = {}
        self.num_promotions = 0

    def quantum(self, level: int) -> int:
        return self.base_quantum << level

    def join_level(self, request) -> int:
        prefill_iters = -(-request.num_prompt_tokens // self.prefill_tokens_per_iter)
        level = 0
        while level < self.num_levels - 1 and self.quantum(level) < prefill_iters:
            level += 1
        return level

    def level(self, request) -> int:
        """Join level (or 0 after a promotion), demoted once per quantum used up (service = output tokens
        generated since joining or since the last promotion)."""
        base = self.promoted_at.get(request.request_id)
        if base is None:
            level, service = self.join_level(request), request.num_output_tokens
        else:
            level, service = 0, request.num_output_tokens - base
        while level < self.num_levels - 1 and service >= self.quantum(level):
            service -= self.quantum(level)
            level += 1
        return level

    def begin_step(self, now, waiting, live):
        """Promote the waiting requests that starved past the limit (FastServe's starvation prevention)."""
        if self.starve_limit_s is None:
            return
        for request in waiting:
            if request.status is RequestStatus.RUNNING:
                continue
            since = request.token_times[-1] if request.token_times else request.arrival_time
            if now - since > self.starve_limit_s and self.level(request) > 0:
                self.promoted_at[request.request_id] = request.num_output_tokens
                self.num_promotions += 1
        if len(self.promoted_at) > 2 * len(live) + 64:  # forget finished requests
            self.promoted_at = {rid: n for rid, n in self.promoted_at.items() if rid in live}

    def key(self, request, now):
        return (self.level(request), request.arrival_time, request.seq_no)

    def should_preempt_for(self, waiting, running, now):
        if not self.preempt:
            return None
        return self._worse_running(waiting, running, now, self.level)
