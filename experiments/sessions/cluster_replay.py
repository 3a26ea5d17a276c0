"""Session replay through a cluster (`cluster.replicas=N replay=sessions`): the rules of
experiments.sessions.replay over the cluster interface of experiments.cluster.replay (submit, run_until)."""

from __future__ import annotations

from experiments.cluster.replay import INF, ClusterReplay

from .replay import SessionTurns


class SessionClusterReplay(SessionTurns, ClusterReplay):
    def __init__(self, cluster, recorder, *, max_model_len: int, max_prompt_tokens=None, max_output_tokens=None, **kw):
        super().__init__(cluster, recorder, **kw)
        self.init_sessions([], max_prompt_tokens, max_output_tokens)
        self.max_model_len = max_model_len

    def _take(self, delivered) -> int:
        n = super()._take(delivered)
        for d in delivered:
            self.turn_finished(d.output, self.cluster.now)
        return n

    def run(self, sessions, mode: str = "sessions", concurrency: int | None = None) -> None:
        if mode != "sessions":
            raise ValueError(f"replay.name: session workloads replay with replay=sessions, got {mode!r}")
        self.init_sessions(sessions, self.max_prompt_tokens, self.max_output_tokens)
        self.begin(concurrency)
        self.validate(self.first_turn_specs())
        self.start_time = self.cluster.now
        while self.sessions_left() or self.cluster.has_unfinished():
            if self._expired():
                break
            wake = self.send_due(self.cluster.now, concurrency, self.last_finish_time)
            if not self.cluster.has_unfinished() and wake == INF:
                continue  # a turn was cut and its session ended: look again
            self._take(self.cluster.run_until(min(wake, self._deadline())))
        if self.timed_out:
            self.abort_in_flight()
            self.end_time = self.cluster.now
        else:
            self.end_time = self.last_finish_time if self.last_finish_time is not None else self.cluster.now
