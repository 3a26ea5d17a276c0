"""Scheduling policies: each decides only order and preemption victims; the mechanism is shared."""

import importlib

from testbed.core.policies.base import SchedulingPolicy

# name -> "module:Class", imported on demand so a new policy is one file plus one line here.
POLICIES = {
    "fcfs": "testbed.core.policies.fcfs:FCFSPolicy",
    "priority": "testbed.core.policies.priority:PriorityPolicy",
    "sjf": "testbed.core.policies.sjf:SJFPolicy",
    "sarathi": "testbed.core.policies.sarathi:SarathiPolicy",
    "mlfq": "testbed.core.policies.mlfq:MLFQPolicy",
    "lpm": "testbed.core.policies.lpm:LPMPolicy",
}


def get_policy(name: str, **options) -> SchedulingPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown scheduler {name!r}; choose one of {sorted(POLICIES)}")
    module, cls = POLICIES[name].split(":")
    return getattr(importlib.import_module(module), cls)(**options)
