"""Replay drivers for a cluster: the modes of experiments.replay (offline, open_loop, closed_loop) over
any cluster with this interface (the simulated one, testbed.cluster.simulated; the multi-process one,
experiments.cluster.processes):

    now                                   the cluster's time (virtual, or the monotonic clock)
    validate(prompt, params, request_id)  ValueError if no replica could ever run it
    submit(request_id, prompt, params, arrival_time, priority) -> replica index
    run_until(t) -> [Delivered]           work until t or until some requests finish, whichever is first
    has_unfinished(), abort_all() -> [Delivered]

Arrivals, lengths and timing rules are those of the single-engine replay: open_loop sends request i at
start + arrival_s, a request due while the cluster was busy keeps its scheduled arrival time; closed_loop
keeps `concurrency` requests in flight in the whole cluster; offline sends everything at the start.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from experiments.replay import MODES
from experiments.traces import RequestSpec, TraceError
from testbed import SamplingParams

INF = float("inf")


class ClusterReplay:
    def __init__(
        self,
        cluster,
        recorder,
        *,
        temperature: float = 0.0,
        max_duration_s: float | None = None,
        on_finish: Callable[[dict], None] | None = None,
        source: str | None = None,
    ):
        self.cluster = cluster
        self.recorder = recorder
        self.temperature = temperature
        self.max_duration_s = max_duration_s
        self.on_finish = on_finish
        self.source = source
        self.start_time: float | None = None
        self.end_time: float | None = None
        self.last_finish_time: float | None = None
        self.num_sent = 0
        self.num_finished = 0
        self.timed_out = False

    def params(self, spec: RequestSpec) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, max_tokens=spec.max_tokens, ignore_eos=spec.ignore_eos)

    def validate(self, specs: Sequence[RequestSpec]) -> None:
        for spec in specs:
            try:
                self.cluster.validate(spec.prompt_token_ids, self.params(spec), spec.request_id)
            except ValueError as e:
                line = (spec.meta or {}).get("line")
                raise TraceError(f"cannot run on this cluster: {e}", self.source, line, "length") from None

    def submit(self, spec: RequestSpec, arrival_time: float) -> None:
        replica = self.cluster.submit(
            spec.request_id, spec.prompt_token_ids, self.params(spec), arrival_time, spec.priority
        )
        self.recorder.on_add(spec, arrival_time, replica)
        self.num_sent += 1

    def _take(self, delivered) -> int:
        for d in delivered:
            self.recorder.on_delivered(d)
            self.num_finished += 1
            t = d.output.metrics.finish_time if d.output.metrics else None
            if t is not None and (self.last_finish_time is None or t > self.last_finish_time):
                self.last_finish_time = t
            if self.on_finish is not None:
                self.on_finish(self.recorder.requests.get(d.output.request_id, {}))
        return len(delivered)

    def _deadline(self) -> float:
        return INF if self.max_duration_s is None else self.start_time + self.max_duration_s

    def _expired(self) -> bool:
        if self.cluster.now >= self._deadline():
            self.timed_out = True
        return self.timed_out

    def abort_in_flight(self) -> int:
        return self._take(self.cluster.abort_all())

    def run(self, specs: Sequence[RequestSpec], mode: str = "offline", concurrency: int | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"replay.mode: unknown replay mode {mode!r}; one of {list(MODES)}")
        if mode == "closed_loop" and (
            not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1
        ):
            raise ValueError(f"replay.concurrency: closed-loop replay needs an integer >= 1, got {concurrency!r}")
        self.validate(specs)
        self.start_time = self.cluster.now
        getattr(self, f"_{mode}")(list(specs), concurrency)
        if self.timed_out:
            self.abort_in_flight()
            self.end_time = self.cluster.now
        else:
            self.end_time = self.last_finish_time if self.last_finish_time is not None else self.cluster.now

    def _drain(self, open_loop: bool = False) -> None:
        """Run until every request finished (or the deadline); open_loop: nothing more will be sent."""
        while self.cluster.has_unfinished() and not self._expired():
            deadline = self._deadline()
            self._take(self.cluster.run_until(deadline, quiet_until=deadline if open_loop else None))

    def _offline(self, specs, _concurrency) -> None:
        for spec in specs:
            self.submit(spec, self.start_time)
        self._drain(open_loop=True)  # everything was sent at the start

    def _open_loop(self, specs, _concurrency) -> None:
        pending = deque(sorted(specs, key=lambda s: s.arrival_s))
        t0 = self.start_time
        while pending:
            if self._expired():
                return
            now = self.cluster.now
            while pending and t0 + pending[0].arrival_s <= now:
                spec = pending.popleft()
                self.submit(spec, t0 + spec.arrival_s)
            if pending:
                until = min(t0 + pending[0].arrival_s, self._deadline())
                self._take(self.cluster.run_until(until, quiet_until=until))
        self._drain(open_loop=True)

    def _closed_loop(self, specs, concurrency) -> None:
        pending = deque(specs)
        in_flight = 0
        while pending or self.cluster.has_unfinished():
            while pending and in_flight < concurrency:
                self.submit(pending.popleft(), self.cluster.now)
                in_flight += 1
            if self._expired():
                return
            in_flight -= self._take(self.cluster.run_until(self._deadline()))
