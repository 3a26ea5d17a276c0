"""Executor kinds (testbed.executor.kind): how an engine's steps are executed, chosen by `executor`.

A registry: name -> "module:Class", imported on demand; a name may also be the import path of the user's
own ExecutorKind subclass (testbed.plugins), e.g. `executor.name=mylab.kinds:MyKind`. It lives above
testbed.executor and testbed.sim so that neither imports the other.
"""

from testbed.executor.kind import ExecutorKind
from testbed.plugins import load_class

EXECUTOR_KINDS = {
    "real": "testbed.executor.kind:RealKind",  # the model runs on this machine's device
    "host": "testbed.executor.kind:HostKind",  # no model: the engine's host-side cost per step
    "sim": "testbed.sim.kind:SimKind",  # a cost model prices each step on a virtual clock
}
RENAMED = {"null": "host"}


def executor_kind(name: str) -> type[ExecutorKind]:
    """The kind registered as `name`, or the ExecutorKind subclass at the import path `name`."""
    if name in RENAMED:
        raise ValueError(f"executor {name!r} is named {RENAMED[name]!r} (executor={RENAMED[name]})")
    return load_class("executor", EXECUTOR_KINDS, name, ExecutorKind)
