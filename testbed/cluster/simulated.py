"""N simulated engines on one time line, event-driven: the real scheduler and KV cache of every replica,
each step priced by the simulated executor's cost model.

The cluster keeps a heap of events: step starts and ends (and KV transfers, when disaggregated). When a
replica's step ends, its finished requests are delivered (to the caller, and to the router's outstanding
counts) and its next step starts at the same instant if it has work, after whatever the caller sent in
reply; a replica with nothing to do has no event and costs nothing until a request reaches it. Each replica's
engine has its own VirtualClock, brought to the cluster's time before it acts, so every clock only moves
forward and all of them read the same time line. Engine.step and its decode runs are the only stepping
code: nothing of the scheduler is copied.

What a step changes is visible to the router from the step's start (the engine has run it), while its
finished requests count as outstanding until the step ends: a router's view of running, waiting and free
blocks can be ahead of the time line by at most one step of that replica, as a real router's view lags it.

Skipping (testbed.sim.decode_runs): a replica may advance the pure decode steps that start before its
horizon, the time before which nothing is added to it, in one go; such a run is one step event. Its
horizon is the caller's quiet_until (the next arrival anywhere in the cluster: the router may read every
replica's state then), unless the caller gave its whole arrival schedule (plan_arrivals) and the router
reads no replica state (Router.reads_replica_state): the schedule is then routed ahead, in order, to the
same replicas as at each arrival, and each replica's horizon is its own next arrival, about N times
further away. A replica whose state allows a run starts its step with the run, without a full engine
step first. Either way every replica runs the same steps as stepping one by one
(tests/cluster/test_horizons.py).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.cluster.prefix import leading_block_hashes
from testbed.cluster.replica import SimReplica
from testbed.cluster.routers import Router, RouteRequest
from testbed.input_processor import ValidatedRequests
from testbed.outputs import RequestOutput
from testbed.sampling_params import SamplingParams
from testbed.sim.clock import VirtualClock

# event kinds, in the order they run when they fall on the same instant: KV transfers land, then steps
# end and deliver their finished requests (the caller may send new ones, as a client would), then the
# replicas due start their next step, which so sees all of that
TRANSFER_DONE, STEP_END, STEP_START = 0, 1, 2
INF = float("inf")


@dataclass
class Delivered:
    replica: int
    output: RequestOutput  # finished (length, stop or abort)


class SimulatedCluster:
    # replicas exchange nothing but what the router sends them, so a state-free router's choices can be
    # made ahead (False where replicas hand requests to each other: P/D disaggregation)
    independent_replicas = True

    def __init__(self, engines: list, router: Router, roles: list[str] | None = None):
        if not engines:
            raise ValueError("a cluster needs at least one engine")
        for engine in engines:
            if not engine.executor_kind.simulated or not isinstance(engine.clock, VirtualClock):
                raise ValueError("a simulated cluster needs engines with executor=sim on a VirtualClock")
        self.replicas = [SimReplica(i, e, (roles or ["mixed"] * len(engines))[i]) for i, e in enumerate(engines)]
        self.router = router
        self.block_size = engines[0].config.cache.block_size
        self.now = 0.0
        self._heap: list[tuple] = []
        self._seq = 0
        self.replica_of: dict[str, int] = {}  # request id -> the replica it was routed to
        self.validated = ValidatedRequests()  # what validate passed (the replicas share one engine config)
        # no request is sent before this time unless one finishes (run_until's quiet_until): a replica's
        # step may advance the decode steps that start before it in one go (Engine.step's horizon)
        self._horizon: float | None = None
        # plan_arrivals: (request id, replica, time it will be submitted) in order; None: no plan (the
        # caller's quiet_until is every replica's horizon)
        self._planned: deque[tuple[str, int, float]] | None = None
        self._plan_until = INF  # with a plan: nothing runs from here on (the caller's deadline)

    # ---- requests --------------------------------------------------------------------------------
    def entry_replicas(self) -> list[SimReplica]:
        """Where new requests go (all replicas; the prefill replicas when disaggregated)."""
        return self.replicas

    def validate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str) -> None:
        """Raise (ValueError) if the replicas could never run this request (they share one engine config,
        seeds aside, so the first one answers for all)."""
        self.replicas[0].engine.validate(prompt_token_ids, params, request_id)
        self.validated.add(request_id, prompt_token_ids, params)

    def route(self, request_id: str, prompt_token_ids: list[int], replicas: list[SimReplica], router: Router) -> int:
        hashes = leading_block_hashes(prompt_token_ids, self.block_size)
        return router.route(RouteRequest(request_id, len(prompt_token_ids), hashes), replicas)

    def plan_arrivals(self, arrivals: Sequence[tuple[str, list[int], float]], until: float = INF) -> bool:
        """The caller's whole schedule from now on: (request id, prompt, time it will be submitted), in the
        order it will submit them, with times that never decrease; nothing runs from `until` on (its
        deadline: what is unfinished then is aborted). Where the router reads no replica state and the
        replicas are independent, routes them all now, in that order (the choices it would make at each
        arrival), so each replica skips decode steps up to its own next arrival; submit then takes only
        these requests, in this order, at or after their times. Returns whether it planned (if not,
        nothing changes)."""
        if self.router.reads_replica_state or not self.independent_replicas:
            return False
        for (_, _, before), (request_id, _, time) in zip(arrivals, arrivals[1:]):
            if time < before:
                raise ValueError(f"planned arrivals go back in time: {request_id!r} at {time} after {before}")
        for replica in self.replicas:
            replica.planned.clear()
        self._planned, self._plan_until = deque(), until
        for request_id, prompt_token_ids, time in arrivals:
            index = self.route(request_id, prompt_token_ids, self.entry_replicas(), self.router)
            self._planned.append((request_id, index, time))
            self.replicas[index].planned.append(time)
        return True

    def _planned_replica(self, request_id: str) -> int:
        """The replica the next planned request was routed to, checking this is it and it is due."""
        assert self._planned is not None
        if not self._planned or self._planned[0][0] != request_id:
            expected = repr(self._planned[0][0]) if self._planned else "none"
            raise ValueError(f"request {request_id!r} is not the next planned arrival ({expected}): plan_arrivals")
        _, index, time = self._planned[0]
        if self.now < time:
            raise ValueError(f"request {request_id!r} planned at {time} came early, at {self.now}")
        self._planned.popleft()
        self.replicas[index].planned.popleft()
        return index

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> int:
        """Route a request arriving now (arrival_time: what its latencies count from; default now) and add
        it to the chosen replica. Returns the replica's index."""
        if self._planned is not None:
            index = self._planned_replica(request_id)
        else:
            index = self.route(request_id, prompt_token_ids, self.entry_replicas(), self.router)
        self._add(self.replicas[index], request_id, prompt_token_ids, params, arrival_time, priority)
        self.replica_of[request_id] = index
        return index

    def _add(self, replica: SimReplica, request_id, prompt_token_ids, params, arrival_time, priority):
        replica.sync(self.now)
        request = replica.engine.add_request(
            request_id,
            prompt_token_ids,
            params,
            self.now if arrival_time is None else arrival_time,
            priority,
            validated=self.validated.take(request_id, prompt_token_ids, params),
        )
        replica.outstanding += 1
        replica.num_routed += 1
        self._wake(replica)
        return request

    # ---- the event loop ----------------------------------------------------------------------------
    def _push(self, time: float, kind: int, payload) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, kind, self._seq, payload))

    def _wake(self, replica: SimReplica) -> None:
        """An idle replica with work starts a step now."""
        if not replica.busy and replica.engine.has_unfinished():
            replica.busy = True
            self._push(self.now, STEP_START, replica)

    def next_event_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def advance_to(self, time: float) -> None:
        """Move the time line to `time` (no event may be skipped: the caller checked next_event_time)."""
        if time < self.now:
            raise ValueError(f"the cluster's time only moves forward ({self.now} -> {time})")
        if self._heap and self._heap[0][0] < time:
            raise ValueError(f"advancing to {time} would skip an event at {self._heap[0][0]}")
        self.now = time

    def run_until(self, time: float, quiet_until: float | None = None) -> list[Delivered]:
        """Run the next event if it comes before `time`, else move the time line to `time` (an arrival
        due at the same instant as an event goes first, as in the single-engine replay). quiet_until: the
        caller sends nothing before then, whatever finishes (an open-loop replay's next arrival): replicas
        may then skip decode steps up to it (testbed.sim.decode_runs); None: every step is an event."""
        self._horizon = quiet_until
        if self._heap and self._heap[0][0] < time:
            return self.run_next()
        if time == float("inf"):
            if not self._heap:
                self._check_not_stuck()
                return []
            return self.run_next()
        self.advance_to(time)
        return []

    def _check_not_stuck(self) -> None:
        stuck = [r.index for r in self.replicas if r.engine.has_unfinished()]
        if stuck:
            raise RuntimeError(f"simulated cluster stuck: replicas {stuck} have requests and no event will run them")

    def run_next(self) -> list[Delivered]:
        """Run the next event; returns the requests that finished with it (in order)."""
        time, kind, _, payload = heapq.heappop(self._heap)
        self.now = time
        if kind == STEP_END:
            return self._step_end(payload)
        if kind == STEP_START:
            self._start_step(payload)
            return []
        return self._transfer_done(payload)

    def _step_end(self, replica: SimReplica) -> list[Delivered]:
        outputs, replica.in_flight = replica.in_flight, []
        replica.busy = False
        delivered = self._deliver(replica, outputs)
        self._wake(replica)
        return delivered

    def _start_step(self, replica: SimReplica) -> None:
        engine = replica.engine
        replica.busy = False
        if not engine.has_unfinished():
            return
        replica.sync(self.now)
        before = engine.step_count
        outputs = self._engine_step(replica)
        if engine.step_count == before:  # nothing could be scheduled: idle until something frees room
            return
        replica.in_flight = [out for out in outputs if out.finished]
        replica.busy = True
        self._push(engine.clock.now, STEP_END, replica)

    def horizon(self, replica: SimReplica) -> float | None:
        """Nothing is added to `replica` before this time (None: no promise, every step is an event)."""
        if self._planned is None:
            return self._horizon
        return min(replica.planned[0], self._plan_until) if replica.planned else self._plan_until

    def _engine_step(self, replica: SimReplica) -> list[RequestOutput]:
        engine, horizon = replica.engine, self.horizon(replica)
        # a replica that can only decode goes straight into the run: the engine step that would start it
        # is one of the run's steps (the run ends with the first step in which requests finish: their
        # outputs come back at its end, as from that step alone)
        if horizon is not None and engine.decode_runs is not None and engine.async_steps is None:
            ran, outputs = engine.run_decode(horizon)
            if ran:
                return outputs
        return engine.step(horizon)

    def _deliver(self, replica: SimReplica, outputs: list[RequestOutput]) -> list[Delivered]:
        for _ in outputs:
            replica.outstanding -= 1
        return [Delivered(replica.index, out) for out in outputs]

    def _transfer_done(self, payload) -> list[Delivered]:
        raise NotImplementedError("no KV transfers in a colocated cluster")

    # ---- state -------------------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return bool(self._heap) or any(r.engine.has_unfinished() for r in self.replicas)

    def abort_all(self) -> list[Delivered]:
        """Abort every request still in an engine (and deliver what finished in steps still in flight)."""
        out = []
        for replica in self.replicas:
            out += self._deliver(replica, replica.in_flight)
            replica.in_flight = []
            for request_id in list(replica.engine.scheduler.requests):
                aborted = replica.engine.abort(request_id)
                if aborted is not None:
                    out += self._deliver(replica, [aborted])
        self._heap.clear()
        self._planned, self._plan_until = None, INF  # nothing more comes
        for replica in self.replicas:
            replica.busy = False
            replica.planned.clear()
        return out

    @property
    def roles(self) -> list[str]:
        return [r.role for r in self.replicas]

    def identity(self) -> dict:
        """The cluster's keys for summary.json."""
        return {"cluster_mode": "simulated", "cluster_router": self.router.name}

    @property
    def simulated_seconds(self) -> float:
        return sum(r.engine.executor.simulated_seconds for r in self.replicas)
