"""Scheduling policies: each decides only order and preemption victims; the mechanism is shared."""
import importlib

from testbed.core.policies.base import SchedulingPolicy

# name -> "module:Class", imported on demand so a new policy is one file plus one line here.
POLICIES = {
    "fcfs": "testbed.core.policies.fcfs:FCFSPolicy",
}


def get_policy(name: str, **options) -> SchedulingPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown scheduler {name!r}; choose one of {sorted(POLICIES)}")
    module, cls = POLICIES[name].split(":")
    return getattr(importlib.import_module(module), cls)(**options)
