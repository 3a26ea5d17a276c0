from testbed.core.policies.base import SchedulingPolicy


class FCFSPolicy(SchedulingPolicy):
    """First come, first served; the latest arrival is preempted first."""

    name = "fcfs"

    def key(self, request, now):
        return (request.arrival_time, request.seq_no)
