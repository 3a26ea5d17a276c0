"""The scheduler, one module per job (as mini-sglang's scheduler package): state.py (limits, queues,
counters, the queue moves jobs share), admission.py (waiting -> running), finishing.py (tokens appended
after a step, requests ended), scheduler.py (the step: running requests first, then admission). The jobs
are classes Scheduler is made of, not objects it holds: they share the running list and its counters, and
a step's hot loops then pay no extra call or attribute lookup for the split."""

from testbed.core.scheduler.scheduler import Scheduler
from testbed.core.scheduler.state import SchedulerLimits

__all__ = ["Scheduler", "SchedulerLimits"]
