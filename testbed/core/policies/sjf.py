from testbed.core.policies.base import SchedulingPolicy


class SJFPolicy(SchedulingPolicy):
    """Shortest job first. Job size is the oracle output length (`by: output`, max_tokens: exact for
    traces, which ignore EOS), the prompt length (`by: prompt`) or both (`by: total`).

    `aging` (tokens per second waited) lowers a request's key the longer it has been in the system, so
    long jobs cannot starve; `preemptive: true` lets a shorter waiting job displace a longer running one."""

    name = "sjf"
    BY = ("output", "prompt", "total")

    def __init__(self, by: str = "output", aging: float = 0.0, preemptive: bool = False):
        if by not in self.BY:
            raise ValueError(f"sjf: `by` must be one of {self.BY}, got {by!r}")
        if aging < 0:
            raise ValueError(f"sjf: aging must be >= 0, got {aging}")
        self.by = by
        self.aging = aging
        self.preemptive = preemptive
        self.time_dependent = aging > 0

    def job_size(self, request) -> float:
        output = request.sampling_params.max_tokens
        output = float("inf") if output is None else output
        return {"output": output, "prompt": request.num_prompt_tokens, "total": request.num_prompt_tokens + output}[
            self.by
        ]

    def key(self, request, now):
        size = self.job_size(request)
        if self.aging:
            size -= self.aging * max(0.0, now - request.arrival_time)
        return (size, request.arrival_time, request.seq_no)

    def should_preempt_for(self, waiting, running, now):
        if not self.preemptive:
            return None
        return self._worse_running(waiting, running, now, lambda r: self.key(r, now)[0])
