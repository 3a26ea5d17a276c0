"""Collects what a run measures: one row per request (from RequestOutputs) and per step (from StepStats).

The recorder listens on Engine.step_callbacks for steps; drivers hand it each request they add and every
finished RequestOutput. Everything is plain Python rows until `requests_frame` / `steps_frame`,
so an interrupted run still has all it measured. A step's row: step_rows; the steps table's columns
straight from decode runs: step_columns.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from experiments.results.step_columns import step_columns
from experiments.results.step_rows import step_row
from testbed.step_stats import StepRun, StepStats

# Columns of the requests table, in order (times: seconds on the engine clock).
REQUEST_COLUMNS = [
    "request_id",
    "trace_arrival_s",
    "arrival_time",
    "first_scheduled_time",
    "first_token_time",
    "finish_time",
    "prompt_tokens",
    "output_tokens",
    "target_output_tokens",
    "cached_tokens",
    "num_preemptions",
    "finish_reason",
    "trace_prompt_tokens",
    "trace_output_tokens",
    "trace_line",
    "token_times",
]


def request_row(spec, arrival_time: float) -> dict:
    """A sent request's row before anything came back (times None, counts 0)."""
    meta = spec.meta or {}
    return {
        "request_id": spec.request_id,
        "trace_arrival_s": float(spec.arrival_s),
        "arrival_time": float(arrival_time),
        "first_scheduled_time": None,
        "first_token_time": None,
        "finish_time": None,
        "prompt_tokens": len(spec.prompt_token_ids),
        "output_tokens": 0,
        "target_output_tokens": spec.max_tokens,
        "cached_tokens": 0,
        "num_preemptions": 0,
        "finish_reason": None,
        "trace_prompt_tokens": meta.get("prompt_len"),
        "trace_output_tokens": meta.get("output_len"),
        "trace_line": None if meta.get("line") is None else str(meta.get("line")),
        "token_times": [],
    }


def requests_frame(rows, columns: list[str] = REQUEST_COLUMNS) -> pd.DataFrame:
    """The requests table from rows (None times become NaN; trace lengths stay nullable integers)."""
    df = pd.DataFrame(list(rows), columns=columns)
    for col in ("arrival_time", "first_scheduled_time", "first_token_time", "finish_time", "trace_arrival_s"):
        df[col] = df[col].astype(float)
    for col in ("prompt_tokens", "output_tokens", "target_output_tokens", "cached_tokens", "num_preemptions"):
        df[col] = df[col].astype("int64")
    for col in ("trace_prompt_tokens", "trace_output_tokens"):
        df[col] = df[col].astype("Int64")
    return df


class Recorder:
    def __init__(self, keep_text: bool = False):
        self.keep_text = keep_text  # keep each finished request's output text (small demo runs)
        self.texts: dict[str, str] = {}
        self.requests: dict[str, dict] = {}
        # step rows (or a StepStats, made into a row when read), and decode runs kept whole (before which row)
        self._rows: list[dict | StepStats] = []
        self._runs: list[tuple[int, StepRun]] = []
        self._kept = 0  # StepStats in _rows
        # keep each StepStats as it is until read, without listeners (attach: the steps table then reads
        # their attributes column by column, steps_frame)
        self.keep_stats = False
        self.listeners: list[Callable[[dict], None]] = []  # called with each step row (progress bar, W&B)
        self._engine = None

    # ---- wiring -------------------------------------------------------------------------------
    def attach(self, engine) -> Recorder:
        self._engine = engine
        self.keep_stats = True
        engine.step_callbacks.append(self.on_step)
        engine.run_callbacks[self.on_step] = self.on_run
        return self

    def detach(self) -> None:
        if self._engine is not None and self.on_step in self._engine.step_callbacks:
            self._engine.step_callbacks.remove(self.on_step)
            self._engine.run_callbacks.pop(self.on_step, None)
        self._engine = None

    # ---- events -------------------------------------------------------------------------------
    def on_step(self, stats) -> None:
        if self.keep_stats and not self.listeners and type(stats) is StepStats:
            self._rows.append(stats)
            self._kept += 1
            return
        row = step_row(stats)
        self._rows.append(row)
        for listener in self.listeners:
            listener(row)

    def on_run(self, run: StepRun) -> None:
        """A simulation's decode run (testbed.step_stats.StepRun), kept whole: its rows are made only
        when someone reads them (steps), the steps table takes its columns directly."""
        if self.listeners:  # they take rows
            for stats in run.step_stats():
                self.on_step(stats)
            return
        self._runs.append((len(self._rows), run))

    @property
    def steps(self) -> list[dict]:
        """One row per step, in order (the rows of decode runs and kept StepStats made now)."""
        if self._kept:
            self._rows = [step_row(row) if type(row) is StepStats else row for row in self._rows]
            self._kept = 0
        if self._runs:
            rows, at = [], 0
            for position, run in self._runs:
                rows += self._rows[at:position]
                rows += map(step_row, run.step_stats())
                at = position
            rows += self._rows[at:]
            self._rows, self._runs = rows, []
        return self._rows  # type: ignore[return-value]  # every entry a row now

    def on_add(self, spec, arrival_time: float, replica: int | None = None) -> None:
        """A request sent (replica: where it went; one engine's table has no replica column)."""
        self.requests[spec.request_id] = request_row(spec, arrival_time)

    def on_delivered(self, delivered) -> None:
        """A finished request from the replay driver (experiments.replay.driver): its output."""
        self.on_output(delivered.output)

    def on_output(self, out) -> None:
        """Record a RequestOutput; only finished ones (including aborts) carry final numbers."""
        row = self.requests.get(out.request_id)
        if row is None or not out.finished:
            return
        m = out.metrics
        completion = out.outputs[0]
        row.update(
            first_scheduled_time=m.first_scheduled_time,
            first_token_time=m.first_token_time,
            finish_time=m.finish_time,
            output_tokens=len(completion.token_ids),
            cached_tokens=int(m.num_cached_tokens),
            num_preemptions=int(m.num_preemptions),
            finish_reason=completion.finish_reason or "abort",
            token_times=list(m.token_times),
        )
        if self.keep_text:
            self.texts[out.request_id] = completion.text

    def on_request(self, request, now: float) -> None:
        """Record straight from the engine's Request (its output never came back: an interrupted step).
        A request that had not finished is recorded as aborted at `now`."""
        row = self.requests.get(request.request_id)
        if row is None:
            return
        finished = request.status.finished
        row.update(
            first_scheduled_time=request.first_scheduled_time,
            first_token_time=request.first_token_time,
            finish_time=request.finish_time if finished and request.finish_time is not None else now,
            output_tokens=len(request.output_token_ids),
            cached_tokens=max(request.num_cached_tokens, 0),
            num_preemptions=request.num_preemptions,
            finish_reason=request.status.value if finished else "abort",
            token_times=list(request.token_times),
        )

    # ---- queries ------------------------------------------------------------------------------
    @property
    def num_finished(self) -> int:
        return sum(1 for r in self.requests.values() if r["finish_reason"] is not None)

    def is_in_flight(self, request_id: str) -> bool:
        """Sent, and nothing final recorded for it yet."""
        row = self.requests.get(request_id)
        return row is not None and row["finish_reason"] is None

    def in_flight(self) -> list[str]:
        return [rid for rid, r in self.requests.items() if r["finish_reason"] is None]

    def requests_frame(self) -> pd.DataFrame:
        return requests_frame(self.requests.values())

    def steps_frame(self) -> pd.DataFrame:
        if not self._runs:
            return pd.DataFrame(self.steps)
        columns = step_columns(self._rows, self._runs)
        # the column arrays as they are (made here, nobody else holds them): no copy into 2-D blocks
        return pd.DataFrame(self.steps) if columns is None else pd.DataFrame(columns, copy=False)
