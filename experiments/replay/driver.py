"""The replay driver: feed a trace's requests to a set of replicas and run them until every request finishes.
A cluster is a replica set (testbed.cluster.simulated, experiments.cluster.processes); one engine is a
one-replica set (experiments.replay.engine_replicas, `Replay.of_engine`). Modes:

    offline      every request arrives at the start (throughput; the trace's timing is ignored)
    open_loop    request i arrives at start + arrival_s (already divided by trace.time_scale); requests are
                 sent as the replicas' time passes their arrival, and the replicas run in between. A request
                 that came due while a step ran keeps its scheduled arrival time, so queueing behind a long
                 step counts in its TTFT (as it would for a real client).
    closed_loop  `concurrency` requests in flight (in the whole set) at all times, in trace order; a new one
                 is sent the moment one finishes (its arrival time is then); trace timing is ignored.
    sessions     multi-turn sessions (experiments.sessions.replay, this driver's subclass)

A replica set has:

    now                                   its time (virtual, the engine's clock, or the monotonic clock)
    validate(prompt, params, request_id)  ValueError if no replica could ever run it
    submit(request_id, prompt, params, arrival_time, priority) -> replica index
    run_until(t, quiet_until) -> [Delivered]  work until t or until some requests finish, whichever is first
                                          (quiet_until: nothing is sent before then, whatever finishes)
    has_unfinished(), abort_all() -> [Delivered]
    plan_arrivals([(request_id, prompt, t)], deadline)  the open loop's whole schedule, before it starts:
                                          the set may route it ahead (or do nothing), then takes only it
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

from experiments.replay.engine_replicas import EngineReplicas
from experiments.traces import RequestSpec, TraceError
from testbed import SamplingParams

MODES = ("offline", "open_loop", "closed_loop")
INF = float("inf")


def check_mode(mode: str, concurrency) -> None:
    if mode not in MODES:
        raise ValueError(f"replay.mode: unknown replay mode {mode!r}; one of {list(MODES)}")
    if mode == "closed_loop" and (not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1):
        raise ValueError(f"replay.concurrency: closed-loop replay needs an integer >= 1, got {concurrency!r}")


class Replay:
    """One replay through `replicas`. Attributes stay readable after an exception (KeyboardInterrupt), so
    the caller can abort what is in flight and keep the measurements."""

    def __init__(
        self,
        replicas,
        recorder,
        *,
        temperature: float = 0.0,
        max_duration_s: float | None = None,
        on_finish: Callable[[dict], None] | None = None,
        source: str | None = None,
        target: str = "cluster",
    ):
        self.replicas = replicas
        self.recorder = recorder
        self.temperature = temperature
        self.max_duration_s = max_duration_s
        self.on_finish = on_finish
        self.source = source  # trace file, for error messages
        self.target = target  # what cannot run a request, in error messages
        self.start_time: float | None = None
        self.end_time: float | None = None
        self.last_finish_time: float | None = None
        self.num_sent = 0
        self.num_finished = 0
        self.timed_out = False
        self._params: dict[str, SamplingParams] = {}  # built by validate, taken by submit

    @classmethod
    def of_engine(cls, engine, recorder, *, sleep: Callable[[float], None] = time.sleep, **kwargs) -> Replay:
        """A replay through one engine (sleep: how the driver waits while the engine is idle)."""
        step_by_step = kwargs.get("max_duration_s") is not None  # the deadline is checked between steps
        return cls(EngineReplicas(engine, sleep=sleep, step_by_step=step_by_step), recorder, target="engine", **kwargs)

    # ---- one request in, finished requests out --------------------------------------------------------
    def params(self, spec: RequestSpec) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, max_tokens=spec.max_tokens, ignore_eos=spec.ignore_eos)

    def _cannot_run(self, spec: RequestSpec, error: ValueError) -> TraceError:
        line = (spec.meta or {}).get("line")
        return TraceError(f"cannot run on this {self.target}: {error}", self.source, line, "length")

    def validate(self, specs: Sequence[RequestSpec]) -> None:
        """Reject, before anything runs, a request no replica can ever run (e.g. too big for the cache).
        The params checked are the ones submit sends (the replica set need not check them again)."""
        for spec in specs:
            try:
                params = self._params[spec.request_id] = self.params(spec)
                self.replicas.validate(spec.prompt_token_ids, params, spec.request_id)
            except ValueError as e:
                raise self._cannot_run(spec, e) from None

    def submit(self, spec: RequestSpec, arrival_time: float) -> None:
        params = self._params.pop(spec.request_id, None)
        if params is None:  # not validated here (a session's later turn)
            params = self.params(spec)
        try:
            replica = self.replicas.submit(spec.request_id, spec.prompt_token_ids, params, arrival_time, spec.priority)
        except ValueError as e:  # no replica can ever run it (too long for the cache, ...)
            raise self._cannot_run(spec, e) from None
        self.recorder.on_add(spec, arrival_time, replica)
        self.num_sent += 1

    def _take(self, delivered) -> int:
        """Record finished requests; returns how many."""
        n = 0
        for d in delivered:
            if d.output is None:  # no output (aborting): if none reached the recorder, read the Request
                if self.recorder.is_in_flight(d.request.request_id):
                    self.recorder.on_request(d.request, self.replicas.now)
                continue
            n += 1
            self.recorder.on_delivered(d)
            self.num_finished += 1
            t = d.output.metrics.finish_time if d.output.metrics else None
            if t is not None and (self.last_finish_time is None or t > self.last_finish_time):
                self.last_finish_time = t
            if self.on_finish is not None:
                self.on_finish(self.recorder.requests.get(d.output.request_id, {}))
            self.request_finished(d.output)
        return n

    def request_finished(self, output) -> None:
        """A finished RequestOutput, after it was recorded (session replay sends the next turn from it)."""

    @property
    def started_at(self) -> float:
        """start_time of a run that has begun (run() sets it; anything timed before that is a bug)."""
        if self.start_time is None:
            raise RuntimeError("the replay has not started: run() sets its start time")
        return self.start_time

    def _deadline(self) -> float:
        return INF if self.max_duration_s is None else self.started_at + self.max_duration_s

    def _expired(self, now: float) -> bool:
        if now >= self._deadline():
            self.timed_out = True
        return self.timed_out

    def abort_in_flight(self) -> int:
        """Abort every request still running (recorded with finish_reason 'abort')."""
        return self._take(self.replicas.abort_all())

    # ---- the modes ------------------------------------------------------------------------------------
    def run(self, specs: Sequence[RequestSpec], mode: str = "offline", concurrency: int | None = None) -> None:
        check_mode(mode, concurrency)
        self.validate(specs)
        self.start_time = self.replicas.now
        getattr(self, f"_{mode}")(list(specs), concurrency)
        self._end()

    def _end(self) -> None:
        if self.timed_out:
            self.abort_in_flight()
            self.end_time = self.replicas.now
        else:  # the run ends when its last request finishes
            self.end_time = self.last_finish_time if self.last_finish_time is not None else self.replicas.now

    def _offline(self, specs, _concurrency) -> None:
        for spec in specs:
            self.submit(spec, self.started_at)
        while self.replicas.has_unfinished() and not self._expired(self.replicas.now):
            deadline = self._deadline()
            self._take(self.replicas.run_until(deadline, quiet_until=deadline))  # everything was sent

    def _open_loop(self, specs, _concurrency) -> None:
        pending = deque(sorted(specs, key=lambda s: s.arrival_s))
        t0, deadline = self.started_at, self._deadline()
        # the whole schedule: a simulated cluster may route it ahead (SimulatedCluster.plan_arrivals)
        self.replicas.plan_arrivals([(s.request_id, s.prompt_token_ids, t0 + s.arrival_s) for s in pending], deadline)
        while pending or self.replicas.has_unfinished():
            now = self.replicas.now
            if self._expired(now):
                return
            while pending and t0 + pending[0].arrival_s <= now:
                spec = pending.popleft()
                self.submit(spec, t0 + spec.arrival_s)
            until = min(t0 + pending[0].arrival_s, deadline) if pending else deadline
            self._take(self.replicas.run_until(until, quiet_until=until))  # nothing is sent before the next arrival

    def _closed_loop(self, specs, concurrency) -> None:
        pending = deque(specs)
        in_flight = 0
        while pending or self.replicas.has_unfinished():
            while pending and in_flight < concurrency:
                self.submit(pending.popleft(), self.replicas.now)
                in_flight += 1
            if self._expired(self.replicas.now):
                return
            in_flight -= self._take(self.replicas.run_until(self._deadline()))  # a new one goes in when one finishes
