"""Replay drivers: feed a trace's requests to an Engine and step it until every request finishes.

    offline      every request arrives at t=0 (throughput; the trace's timing is ignored)
    open_loop    request i arrives at start + arrival_s (already divided by trace.time_scale), on the
                 engine's clock; requests are added as the clock passes their arrival and the engine is
                 stepped in between; the driver sleeps only when the engine is idle. A request that came
                 due while a step ran keeps its scheduled arrival time, so queueing behind a long step
                 counts in its TTFT (as it would for a real client).
    closed_loop  `concurrency` requests in flight at all times, in trace order; a new one is sent the
                 moment one finishes (its arrival time is then); trace timing is ignored.

All times are the engine's clock (Engine.clock, time.monotonic by default).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

from experiments.recorder import Recorder
from experiments.traces import RequestSpec, TraceError
from testbed import SamplingParams

MODES = ("offline", "open_loop", "closed_loop")


class Replay:
    """One replay of `specs` through `engine`. Attributes stay readable after an exception
    (KeyboardInterrupt), so the caller can abort what is in flight and keep the measurements."""

    def __init__(
        self,
        engine,
        recorder: Recorder,
        *,
        temperature: float = 0.0,
        max_duration_s: float | None = None,
        on_finish: Callable[[dict], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        source: str | None = None,
    ):
        self.engine = engine
        self.recorder = recorder
        self.temperature = temperature
        self.max_duration_s = max_duration_s
        self.on_finish = on_finish
        self.sleep = sleep
        self.source = source  # trace file, for error messages
        self.start_time: float | None = None
        self.end_time: float | None = None
        self.last_finish_time: float | None = None
        self.num_sent = 0
        self.requests = {}  # request id -> the engine's Request (for interrupted runs)
        self.num_finished = 0
        self.timed_out = False

    # ---- one request in, outputs out ----------------------------------------------------------
    def params(self, spec: RequestSpec) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, max_tokens=spec.max_tokens, ignore_eos=spec.ignore_eos)

    def _cannot_run(self, spec: RequestSpec, error: ValueError) -> TraceError:
        return TraceError(f"cannot run on this engine: {error}", self.source, (spec.meta or {}).get("line"), "length")

    def validate(self, specs: Sequence[RequestSpec]) -> None:
        """Reject, before anything runs, a request the engine can never run (e.g. too big for the cache)."""
        validate = getattr(self.engine, "validate", None)
        if validate is None:
            return
        for spec in specs:
            try:
                validate(spec.prompt_token_ids, self.params(spec), spec.request_id)
            except ValueError as e:
                raise self._cannot_run(spec, e) from None

    def submit(self, spec: RequestSpec, arrival_time: float) -> None:
        try:
            request = self.engine.add_request(
                spec.request_id,
                spec.prompt_token_ids,
                self.params(spec),
                arrival_time=arrival_time,
                priority=spec.priority,
            )
        except ValueError as e:  # the engine can never run it (too long for the cache, ...)
            raise self._cannot_run(spec, e) from None
        self.requests[spec.request_id] = request
        self.recorder.on_add(spec, arrival_time)
        self.num_sent += 1

    def step(self, horizon: float | None = None) -> int:
        """One engine step; returns how many requests finished in it. horizon: no request is sent before
        the clock reaches it unless one finishes (a simulation may then advance decode steps up to it in
        one go, Engine.step); None: one step."""
        finished = 0
        if self.max_duration_s is not None:  # the deadline is checked between steps: step one by one
            horizon = None
        for out in self.engine.step(horizon):
            self.recorder.on_output(out)
            if out.finished:
                finished += 1
                self.num_finished += 1
                t = out.metrics.finish_time if out.metrics else None
                if t is not None and (self.last_finish_time is None or t > self.last_finish_time):
                    self.last_finish_time = t
                if self.on_finish is not None:
                    self.on_finish(self.recorder.requests.get(out.request_id, {}))
                self.request_finished(out)
        return finished

    def request_finished(self, out) -> None:
        """A finished RequestOutput, after it was recorded (session replay sends the next turn from it)."""

    def _expired(self, now: float) -> bool:
        if self.max_duration_s is not None and now - self.start_time >= self.max_duration_s:
            self.timed_out = True
        return self.timed_out

    def abort_in_flight(self) -> int:
        """Abort every request still in the engine (recorded with finish_reason 'abort')."""
        n = 0
        for rid in self.recorder.in_flight():
            try:
                out = self.engine.abort(rid)
            except Exception:
                out = None
            if out is not None:
                self.recorder.on_output(out)
                n += 1
            elif (
                self.requests.get(rid) is not None
            ):  # finished inside the interrupted step, before its output came back
                self.recorder.on_request(self.requests[rid], self.engine.clock())
        return n

    # ---- drivers ------------------------------------------------------------------------------
    def run(self, specs: Sequence[RequestSpec], mode: str = "offline", concurrency: int | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"replay.mode: unknown replay mode {mode!r}; one of {list(MODES)}")
        if mode == "closed_loop" and (
            not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1
        ):
            raise ValueError(f"replay.concurrency: closed-loop replay needs an integer >= 1, got {concurrency!r}")
        self.validate(specs)
        self.start_time = self.engine.clock()
        getattr(self, f"_{mode}")(list(specs), concurrency)
        if self.timed_out:
            self.abort_in_flight()
            self.end_time = self.engine.clock()
        else:  # the run ends when its last request finishes
            self.end_time = self.last_finish_time if self.last_finish_time is not None else self.engine.clock()

    def _offline(self, specs, _concurrency) -> None:
        for spec in specs:
            self.submit(spec, self.start_time)
        while self.engine.has_unfinished() and not self._expired(self.engine.clock()):
            self.step(float("inf"))

    def _open_loop(self, specs, _concurrency) -> None:
        pending = deque(sorted(specs, key=lambda s: s.arrival_s))
        t0, clock = self.start_time, self.engine.clock
        while pending or self.engine.has_unfinished():
            now = clock()
            if self._expired(now):
                return
            while pending and t0 + pending[0].arrival_s <= now:
                spec = pending.popleft()
                self.submit(spec, t0 + spec.arrival_s)
            if self.engine.has_unfinished():
                self.step(t0 + pending[0].arrival_s if pending else float("inf"))
            elif pending:
                wait = t0 + pending[0].arrival_s - clock()
                if self.max_duration_s is not None:
                    wait = min(wait, t0 + self.max_duration_s - clock())
                if wait > 0:
                    self.sleep(wait)

    def _closed_loop(self, specs, concurrency) -> None:
        pending = deque(specs)
        in_flight = 0
        while pending or self.engine.has_unfinished():
            while pending and in_flight < concurrency:
                self.submit(pending.popleft(), self.engine.clock())
                in_flight += 1
            if self._expired(self.engine.clock()):
                return
            in_flight -= self.step(float("inf"))  # a new request goes in only when one finishes
