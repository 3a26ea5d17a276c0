"""One engine as a one-replica set, so that the replay driver (experiments.replay.driver) runs it as it runs a
cluster: `now` is the engine's clock, `run_until(t)` is one Engine.step, or, with nothing to do, sleeping on
the engine's clock until t (a simulation's sleep is virtual).

A step's horizon is `t`: the driver sends nothing before t unless a request finishes. Engine.step ends a
simulated decode run with the first step in which requests finish (the driver reads the clock at its end,
as after that step alone), unless the driver sends nothing before t even then (`quiet_until` >= t:
offline, open loop), when the run goes on past it (Engine.step's sends_on_finish). With
`step_by_step` (a run with a deadline) every step is one step, so the deadline is checked between steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.input_processor import ValidatedRequests
from testbed.outputs import RequestOutput

INF = float("inf")


@dataclass
class Delivered:
    """A finished request, as testbed.cluster.simulated.Delivered. output None: the request finished inside
    an interrupted step and its output never came back; `request` (the engine's Request) has its numbers."""

    replica: int
    output: RequestOutput | None
    request: Any = None


class EngineReplicas:
    roles = ["mixed"]

    def __init__(self, engine, *, sleep: Callable[[float], None] = time.sleep, step_by_step: bool = False):
        self.engine = engine
        self.sleep = sleep
        self.step_by_step = step_by_step
        self.requests: dict[str, Any] = {}  # request id -> the engine's Request, in the order sent
        self.validated = ValidatedRequests()

    @property
    def now(self) -> float:
        return self.engine.clock()

    def validate(self, prompt_token_ids: list[int], params, request_id: str) -> None:
        self.engine.validate(prompt_token_ids, params, request_id)
        self.validated.add(request_id, prompt_token_ids, params)

    def submit(self, request_id: str, prompt_token_ids: list[int], params, arrival_time: float, priority=0) -> int:
        validated = self.validated.take(request_id, prompt_token_ids, params)
        request = self.engine.add_request(
            request_id, prompt_token_ids, params, arrival_time=arrival_time, priority=priority, validated=validated
        )
        self.requests[request_id] = request
        return 0

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def plan_arrivals(self, arrivals, until: float = INF) -> bool:
        """Nothing to plan: one replica's horizon is the next arrival already."""
        return False

    def run_until(self, time: float, quiet_until: float | None = None) -> list[Delivered]:
        if self.engine.has_unfinished():
            quiet = quiet_until is not None and quiet_until >= time
            outputs = self.engine.step(None if self.step_by_step else time, sends_on_finish=not quiet)
            return [Delivered(0, out) for out in outputs if out.finished]
        if time < INF:
            wait = time - self.engine.clock()
            if wait > 0:
                self.sleep(wait)
        return []

    def abort_all(self) -> list[Delivered]:
        """Abort every request still in the engine; every other request sent comes back with its Request, for
        the caller to record if its output never reached it (an interrupted step, or an interrupted caller)."""
        out = []
        for request_id, request in self.requests.items():
            try:
                aborted = self.engine.abort(request_id)
            except Exception:
                aborted = None
            if aborted is not None:
                out.append(Delivered(0, aborted))
            elif request is not None:
                out.append(Delivered(0, None, request))
        return out
