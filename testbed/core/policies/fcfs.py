from testbed.core.policies.base import SchedulingPolicy


class FCFSPolicy(SchedulingPolicy):
    """First come, first served, vLLM's default (`--scheduling-policy fcfs`): arrival order for both queues;
    when memory runs out the latest arrival is preempted first (vLLM v1 pops the tail of its running
    queue, which is in admission order; ours is in arrival order, the same unless requests were re-queued)."""

    name = "fcfs"

    def key(self, request, now):
        return (request.arrival_time, request.seq_no)
