"""The session replay driver (`replay=sessions`): sessions start at their trace times (divided by
trace.time_scale), each turn after the first is sent think_s after the previous one finished, with the
whole history as its prompt (experiments.sessions.types).

`replay.concurrency` caps the sessions active at once (null: no cap); a session that finds no free slot
starts when one frees, and its first turn's arrival time is then. A turn is cut, ending its session, when
its prompt would pass `replay.max_prompt_tokens` or prompt + answer would pass the engine's context, or
when the engine refuses it; turns cut are counted. `replay.max_output_tokens` caps each answer. An aborted
turn (max_duration_s) ends its session.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import replace

import pandas as pd

from experiments.replay.driver import INF, Replay
from experiments.traces import RequestSpec
from testbed import SamplingParams

from .types import Session

MAX_TURN_CLASS = 7  # turns past this share one eviction class

TURN_COLUMNS = ["request_id", "session_id", "turn", "think_s", "new_tokens", "history_tokens", "prompt_tokens"]


class SessionTurns:
    """The session bookkeeping: turns waiting for their send time, histories, the turns table. The driver
    provides submit(spec, t), started_at, max_model_len and calls turn_finished(output) for every finished
    request."""

    # provided by the driver (annotations only: nothing here shadows the driver's)
    started_at: float
    max_model_len: int
    submit: Callable[[RequestSpec, float], None]

    def init_sessions(self, sessions, max_prompt_tokens=None, max_output_tokens=None) -> None:
        self.max_prompt_tokens = max_prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.turn_rows: list[dict] = []
        self.turns_cut = 0
        self._sessions: list[Session] = list(sessions)
        self._waiting: deque[int] = deque()  # sessions not started, by start time
        self._pending: list[tuple] = []  # heap of (send time, seq, session index, turn index)
        self._history: dict[int, list[int]] = {}  # session index -> tokens of its history so far
        self._in_flight: dict[str, tuple[int, int]] = {}  # request id -> (session index, turn index)
        self._active = 0
        self._seq = 0

    def first_turn_specs(self) -> list[RequestSpec]:
        return [self._spec(i, 0, s.turns[0].new_token_ids, s.start_s) for i, s in enumerate(self._sessions)]

    def _spec(self, si: int, k: int, prompt: list[int], arrival_s: float) -> RequestSpec:
        s = self._sessions[si]
        turn = s.turns[k]
        max_tokens = min(turn.max_tokens, self.max_output_tokens or turn.max_tokens)
        meta = {**s.meta, "session": s.session_id, "turn": k}
        return RequestSpec(f"{s.session_id}.t{k}", arrival_s, prompt, max_tokens, meta=meta)

    def _end_session(self) -> None:
        self._active -= 1

    def _schedule(self, t: float, si: int, k: int) -> None:
        heapq.heappush(self._pending, (t, self._seq, si, k))
        self._seq += 1

    def _send(self, t: float, si: int, k: int) -> None:
        session = self._sessions[si]
        history = self._history.get(si, [])
        prompt = history + session.turns[k].new_token_ids
        spec = self._spec(si, k, prompt, t - self.started_at)
        too_long = self.max_prompt_tokens is not None and len(prompt) > self.max_prompt_tokens
        if k > 0 and (too_long or len(prompt) + spec.max_tokens > self.max_model_len):
            self.turns_cut += 1
            return self._end_session()
        try:
            self.submit(spec, t)
        except ValueError:
            if k == 0:
                raise
            self.turns_cut += 1
            return self._end_session()
        self._in_flight[spec.request_id] = (si, k)
        self.turn_rows.append(
            {
                "request_id": spec.request_id,
                "session_id": session.session_id,
                "turn": k,
                "think_s": session.turns[k].think_s if k else 0.0,
                "new_tokens": len(session.turns[k].new_token_ids),
                "history_tokens": len(history),
                "prompt_tokens": len(prompt),
            }
        )

    def turn_finished(self, out, now: float) -> None:
        where = self._in_flight.pop(out.request_id, None)
        if where is None:
            return
        si, k = where
        completion = out.outputs[0]
        session = self._sessions[si]
        if completion.finish_reason in (None, "abort") or k + 1 >= len(session.turns):
            return self._end_session()
        self._history[si] = list(out.prompt_token_ids) + list(completion.token_ids)
        finish = out.metrics.finish_time if out.metrics and out.metrics.finish_time is not None else now
        self._schedule(finish + session.turns[k + 1].think_s, si, k + 1)

    def send_due(self, now: float, concurrency: int | None, last_finish: float | None) -> float:
        """Start the sessions whose time came (while there are slots) and send every turn due by now;
        returns when something is next due (inf: nothing until a turn finishes)."""
        waiting, t0 = self._waiting, self.started_at
        while waiting and (concurrency is None or self._active < concurrency):
            start = t0 + self._sessions[waiting[0]].start_s
            if start > now:
                break
            self._active += 1
            # a session that waited for a slot starts when the slot freed (at the latest finish so far)
            freed = last_finish if concurrency is not None and last_finish else start
            self._schedule(max(start, freed), waiting.popleft(), 0)
        while self._pending and self._pending[0][0] <= now:
            t, _, si, k = heapq.heappop(self._pending)
            self._send(t, si, k)
        wake = [self._pending[0][0]] if self._pending else []
        if waiting and (concurrency is None or self._active < concurrency):
            wake.append(t0 + self._sessions[waiting[0]].start_s)
        return min(wake, default=float("inf"))

    def sessions_left(self) -> bool:
        return bool(self._waiting or self._pending)

    def begin(self, concurrency: int | None) -> None:
        bad = isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        if concurrency is not None and bad:
            raise ValueError(f"replay.concurrency: null or an integer >= 1 (active sessions), got {concurrency!r}")
        self._waiting = deque(sorted(range(len(self._sessions)), key=lambda i: self._sessions[i].start_s))

    def turns_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.turn_rows, columns=TURN_COLUMNS)


class SessionReplay(SessionTurns, Replay):
    """The session mode of the replay driver, through any replica set (one engine: `of_engine`)."""

    def __init__(self, replicas, recorder, *, max_model_len: int, max_prompt_tokens=None, max_output_tokens=None, **kw):
        super().__init__(replicas, recorder, **kw)
        self.init_sessions([], max_prompt_tokens, max_output_tokens)
        self.max_model_len = max_model_len

    @classmethod
    def of_engine(cls, engine, recorder, **kwargs) -> SessionReplay:
        kwargs.setdefault("max_model_len", engine.max_model_len)
        return super().of_engine(engine, recorder, **kwargs)  # type: ignore[return-value]

    def request_finished(self, output) -> None:
        self.turn_finished(output, self.replicas.now)

    def params(self, spec: RequestSpec) -> SamplingParams:
        # the request class of workload-aware eviction (testbed/core/workload_eviction.py): the turn index
        return replace(super().params(spec), extra_args={"request_class": min(spec.meta["turn"], MAX_TURN_CLASS)})

    def run(self, sessions, mode: str = "sessions", concurrency: int | None = None) -> None:
        if mode != "sessions":
            raise ValueError(f"replay.name: session workloads replay with replay=sessions, got {mode!r}")
        self.init_sessions(sessions, self.max_prompt_tokens, self.max_output_tokens)
        self.begin(concurrency)
        self.validate(self.first_turn_specs())
        self.start_time = self.replicas.now
        while self.sessions_left() or self.replicas.has_unfinished():
            now = self.replicas.now
            if self._expired(now):
                break
            wake = self.send_due(now, concurrency, self.last_finish_time)
            if not self.replicas.has_unfinished() and wake == INF:
                continue  # a turn was cut and its session ended: look again
            # nothing is sent before wake unless a turn finishes
            self._take(self.replicas.run_until(min(wake, self._deadline())))
        self._end()
