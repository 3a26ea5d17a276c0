"""Scheduling policies: each decides only order and preemption victims; the mechanism is shared."""

from testbed.core.policies.base import SchedulingPolicy
from testbed.plugins import load_class

# name -> "module:Class", imported on demand so a new policy is one file plus one line here; a name may
# also be the import path of the user's own SchedulingPolicy subclass (testbed.plugins).
POLICIES = {
    "fcfs": "testbed.core.policies.fcfs:FCFSPolicy",
    "priority": "testbed.core.policies.priority:PriorityPolicy",
    "sjf": "testbed.core.policies.sjf:SJFPolicy",
    "sarathi": "testbed.core.policies.sarathi:SarathiPolicy",
    "mlfq": "testbed.core.policies.mlfq:MLFQPolicy",
    "lpm": "testbed.core.policies.lpm:LPMPolicy",
}


def get_policy(name: str, kv=None, **options) -> SchedulingPolicy:
    """The policy `name` with its options; kv: the KV allocator, for the policies that read it (needs_kv)."""
    policy_cls = load_class("scheduler", POLICIES, name, SchedulingPolicy)
    if policy_cls.needs_kv:
        if kv is None:
            raise ValueError(f"scheduler {name!r} reads the KV cache: get_policy needs kv=")
        return policy_cls(kv=kv, **options)
    return policy_cls(**options)
