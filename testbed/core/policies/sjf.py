from testbed.core.policies.base import SchedulingPolicy


class SJFPolicy(SchedulingPolicy):
    """Shortest job first with an oracle job size, in the spirit of the size-based LLM schedulers (e.g.
    Qiu et al. 2024 "Efficient Interactive LLM Serving with Proxy Model-based Sequence Length Prediction",
    Fu et al. 2024 "Efficient LLM Scheduling by Learning to Rank"), here with the true size instead of a
    prediction: the output length (`by: output`, max_tokens: exact for traces, which ignore EOS), the
    prompt length (`by: prompt`) or both (`by: total`).

    `aging` (tokens of job size forgiven per second waited) bounds starvation: a request ranks ahead of
    any request that arrived `(its size - their size) / aging` seconds or more after it, so a long job
    waits at most about (its size - the shortest size) / aging seconds behind later short ones. The
    trade-off: large aging approaches FCFS (no short-job advantage), 0 is pure SJF, under which a long
    job can wait forever while shorter ones keep arriving. The default (100 tokens/s) keeps most of the
    short-job advantage on chat-length outputs (tens to hundreds of tokens) while a 1,000-token job
    overtakes fresh short ones within ~10 s. Since every waiting request ages at the same rate, the
    order is that of `size + aging * arrival_time`, a key that does not change with time (no re-sort
    per step). `preemptive: true` lets a shorter waiting job displace a longer running one."""

    name = "sjf"
    BY = ("output", "prompt", "total")

    def __init__(self, by: str = "output", aging: float = 100.0, preemptive: bool = False):
        if by not in self.BY:
            raise ValueError(f"sjf: `by` must be one of {self.BY}, got {by!r}")
        if aging < 0:
            raise ValueError(f"sjf: aging must be >= 0, got {aging}")
        self.by = by
        self.aging = aging
        self.preemptive = preemptive

    def job_size(self, request) -> float:
        output = request.sampling_params.max_tokens
        output = float("inf") if output is None else output
        return {"output": output, "prompt": request.num_prompt_tokens, "total": request.num_prompt_tokens + output}[
            self.by
        ]

    def key(self, request, now):
        # size - aging * (now - arrival), less the term aging * now that every request shares
        return (self.job_size(request) + self.aging * request.arrival_time, request.arrival_time, request.seq_no)

    def should_preempt_for(self, waiting, running, now):
        if not self.preemptive:
            return None
        return self._worse_running(waiting, running, now, lambda r: self.key(r, now)[0])
