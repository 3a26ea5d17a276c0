"""Collects what a run measures: one row per request (from RequestOutputs) and per step (from StepStats).

The recorder listens on Engine.step_callbacks for steps; drivers hand it each request they add and every
finished RequestOutput. Everything is plain Python rows until `requests_frame` / `steps_frame`,
so an interrupted run still has all it measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from itertools import chain
from operator import attrgetter, itemgetter

import numpy as np
import pandas as pd

from testbed.core.allocators.counter_spans import CounterSpans, stats_table
from testbed.step_stats import KV_FIELDS, StepRun, StepStats, kv_stats_of

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


# List columns of the steps table: request ids scheduled in the step (batch order), the new tokens each
# got, the ids that were prefilling (prompt chunks, recomputation after preemption) and those preempted.
STEP_ID_COLUMNS = ("scheduled_ids", "scheduled_tokens", "prefill_ids", "preempted_ids")


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


# a stats dataclass's (getter of its field values, their column names), made once per type
_DATACLASS_FIELDS: dict[type, tuple] = {}
_SCALARS = {int, float, bool, type(None)}


def kv_fields(kv) -> dict:
    """Flatten a KVCacheStats (any version) into kv_* columns plus the derived ratios.

    kv_usage = used_blocks / num_blocks. frag_internal / frag_reserved / frag_external are fractions of all
    token slots, from the allocator's memory breakdown (internal_slots: held, beyond the request's final
    length; reserved_slots: held for the request's own future tokens; external_slots: free but unusable by
    the request waiting for memory). Stats without that breakdown (older KVCacheStats) count every empty
    held slot (slack_token_slots) as internal and report 0 for the other two."""
    spec = _DATACLASS_FIELDS.get(type(kv))
    if spec is None and dataclasses.is_dataclass(kv):
        names = [f.name for f in dataclasses.fields(kv)]
        getter = attrgetter(*names) if len(names) > 1 else lambda o: (getattr(o, names[0]),)
        spec = _DATACLASS_FIELDS[type(kv)] = (getter, [f"kv_{name}" for name in names])
    if spec is not None:
        getter, keys = spec
        values = getter(kv)
        if set(map(type, values)) <= _SCALARS:  # the usual case: every field a plain number
            row = dict(zip(keys, values))
        else:
            row = {k: v for k, v in zip(keys, values) if v is None or isinstance(v, (int, float, bool))}
    else:
        raw = {k: v for k, v in vars(kv).items() if not k.startswith("_")}
        row = {f"kv_{k}": v for k, v in raw.items() if isinstance(v, (int, float, bool)) or v is None}
    num_blocks = getattr(kv, "num_blocks", 0) or 0
    total = num_blocks * (getattr(kv, "block_size", 1) or 1) or 1
    row["kv_usage"] = (getattr(kv, "used_blocks", 0) or 0) / num_blocks if num_blocks else 0.0
    parts = [
        getattr(kv, name, None)
        for name in ("token_slots", "reserved_slots", "internal_slots", "external_slots", "free_slots")
    ]
    ints = [p for p in parts if isinstance(p, int)]
    if len(ints) == len(parts) and sum(ints) == total:
        row["frag_internal"] = ints[2] / total
        row["frag_reserved"] = ints[1] / total
        row["frag_external"] = ints[3] / total
    else:
        row["frag_internal"] = (getattr(kv, "slack_token_slots", 0) or 0) / total
        row["frag_reserved"] = 0.0
        row["frag_external"] = 0.0
    return row


def step_row(stats) -> dict:
    """A StepStats as a row of the steps table."""
    row = {
        "step": stats.step,
        "start_time": stats.start_time,
        "duration_s": stats.duration_s,
        "num_seqs": stats.num_seqs,
        "num_prefill_tokens": stats.num_prefill_tokens,
        "num_decode_tokens": stats.num_decode_tokens,
        "num_preempted": stats.num_preempted,
        "num_waiting": stats.num_waiting,
        "num_running": stats.num_running,
    }
    # optional fields: spec decode; structured output's grammar time (seconds of the step)
    for name in ("num_spec_tokens", "num_accepted_tokens", "grammar_time_s"):
        if hasattr(stats, name):
            row[name] = getattr(stats, name)
    for name in STEP_ID_COLUMNS:  # who ran and who was preempted (list columns; experiments.statistics.compare)
        row[name] = getattr(stats, name, None) or []
    row.update(kv_fields(stats.kv))
    return row


def runs_columns(runs: list[StepRun]) -> dict[str, np.ndarray]:
    """Decode runs' rows (testbed.step_stats.StepRun), all runs one after the other, as column arrays equal
    to step_row of each step up to the cache's (kv_columns): the same numbers, in the dtypes pandas gives
    their Python values; list columns hold each run's own lists (nobody writes into a step row's)."""
    lengths = np.array([len(run) for run in runs], dtype=np.int64)
    firsts = np.cumsum(lengths) - lengths  # where each run starts in the columns
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(firsts, lengths)
    starts = np.array([t for run in runs for t in run.start_times], dtype=np.float64)
    ends = np.array([t for run in runs for t in run.end_times], dtype=np.float64)
    grammar = np.zeros(len(starts))
    grammar[firsts] = [run.grammar_time_s for run in runs]  # the first step's

    def each(values, dtype=np.int64) -> np.ndarray:
        """One value per run, on each of its steps."""
        per_run = np.empty(len(runs), dtype=dtype)
        per_run[:] = values if dtype is not object else _objects(values)
        return np.repeat(per_run, lengths)

    seqs = each([run.num_seqs for run in runs])
    running = seqs.copy()  # less the requests that finished, at each run's last step
    running[firsts + lengths - 1] -= [run.num_finished for run in runs]
    empty: list = []
    return {
        "step": each([run.first_step for run in runs]) + within,
        "start_time": starts,
        "duration_s": ends - starts,  # end - start, as StepStats'
        "num_seqs": seqs,
        "num_prefill_tokens": np.zeros(len(starts), dtype=np.int64),
        "num_decode_tokens": seqs,
        "num_preempted": np.zeros(len(starts), dtype=np.int64),
        "num_waiting": each([run.num_waiting for run in runs]),
        "num_running": running,
        "grammar_time_s": grammar,
        "scheduled_ids": each([run.scheduled_ids for run in runs], object),
        "scheduled_tokens": each([run.scheduled_tokens for run in runs], object),
        "prefill_ids": each([empty] * len(runs), object),
        "preempted_ids": each([empty] * len(runs), object),
    }


def _objects(values: list) -> np.ndarray:
    """An object array of these values as they are (one by one: a list of lists would become 2-D)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


KV_PARTS: tuple[str, ...] = ("num_blocks", "block_size", "used_blocks", "token_slots", "reserved_slots")
KV_PARTS += ("internal_slots", "external_slots", "free_slots", "slack_token_slots")


def kv_columns(runs_kv: list) -> dict[str, np.ndarray] | None:
    """kv_fields of each step's cache stats, run after run (each a StepRun.kv: CounterSpans, or per step
    testbed.step_stats.kv_compact: KVCacheStats field tuples, or objects), as int64 / float64 column
    arrays; None unless they are all plain ints of one type with the KVCacheStats fields and a cache of
    at least one block."""
    # no tuple per step from CounterSpans (None: they are made of anything but plain ints)
    table = stats_table(runs_kv) if runs_kv and all(type(kv) is CounterSpans for kv in runs_kv) else None
    columns = (
        dict(zip([f"kv_{name}" for name in KV_FIELDS], table))
        if table is not None
        else _kv_row_columns([stats for kv in runs_kv for stats in kv])
    )
    if columns is None or any(f"kv_{name}" not in columns for name in KV_PARTS):
        return None
    num_blocks, block_size, used, token, reserved, internal, external, free, slack = (
        columns[f"kv_{name}"] for name in KV_PARTS
    )
    if (num_blocks <= 0).any() or (block_size <= 0).any():
        return None
    # the derived ratios, as kv_fields computes them (int / int and a sum of ints: the same doubles)
    total = num_blocks * block_size
    columns["kv_usage"] = used / num_blocks
    whole = token + reserved + internal + external + free == total
    columns["frag_internal"] = np.where(whole, internal / total, slack / total)
    columns["frag_reserved"] = np.where(whole, reserved / total, 0.0)
    columns["frag_external"] = np.where(whole, external / total, 0.0)
    return columns


def _kv_row_columns(stats: list) -> dict[str, np.ndarray] | None:
    """kv_columns' int64 columns from each step's stats (tuples, or objects)."""
    if all(type(s) is tuple for s in stats):
        keys = [f"kv_{name}" for name in KV_FIELDS]
        rows = stats
    else:
        objects = [kv_stats_of(s) for s in stats]
        kind = type(objects[0])
        if not dataclasses.is_dataclass(kind) or any(type(s) is not kind for s in objects):
            return None
        kv_fields(objects[0])  # makes the type's getter
        getter, keys = _DATACLASS_FIELDS[kind]
        rows = list(map(getter, objects))
    # every value a plain int, every row one per key: one pass over all the values, then numpy reads them
    if rows and (set(map(len, rows)) != {len(keys)} or set(map(type, chain.from_iterable(rows))) != {int}):
        return None
    table = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=len(rows) * len(keys))
    table = table.reshape(len(rows), len(keys))
    return {key: table[:, i] for i, key in enumerate(keys)}


def _fits(values: list, kind: np.dtype) -> bool:
    """Row values pandas would give this dtype too: Python ints within int64 (int64), floats (float64)."""
    if kind == np.dtype(np.int64):
        return set(map(type, values)) <= {int} and (not values or (min(values) >= -(2**63) and max(values) < 2**63))
    return kind == np.dtype(np.float64) and set(map(type, values)) <= {float}


def step_columns(rows: list, runs: list[tuple[int, StepRun]]) -> dict[str, np.ndarray | list] | None:
    """The steps table's columns from step rows (or StepStats) and decode runs kept whole (each before which row); None
    where they do not all have the same columns in the same order (the caller then makes every row). A
    column is an array of the runs' dtype where the rows' values fit it (_fits; any value for a list
    column), else one list of every value (pandas infers its dtype, as from rows)."""
    if any(type(run.grammar_time_s) is not float for _, run in runs):
        return None  # runs_columns makes that column float64
    kv = kv_columns([run.kv for _, run in runs])  # every run's at once
    if kv is None:
        return None
    columns: dict = runs_columns([run for _, run in runs])
    columns.update(kv)
    keys = list(columns)
    kept = [row for row in rows if type(row) is StepStats]
    by_key = _stats_columns(kept, keys) if rows and len(kept) == len(rows) else None
    if by_key is None:
        rows = [step_row(row) if type(row) is StepStats else row for row in rows]
        if rows and (list(rows[0]) != keys or any(list(row) != keys for row in rows)):
            return None
        # the rows' values column by column, each row read once (all its keys while it is in the cache)
        by_key = dict(zip(keys, map(list, zip(*map(itemgetter(*keys), rows))))) if rows else dict.fromkeys(keys, [])
    # where each row and each run's steps go: a run comes before the row at its position
    positions = np.array([position for position, _ in runs], dtype=np.int64)
    lengths = np.array([len(run) for _, run in runs], dtype=np.int64)
    before = np.concatenate([[0], np.cumsum(lengths)])  # run steps before run i
    row_at = np.arange(len(rows), dtype=np.int64)
    row_at += before[np.searchsorted(positions, row_at, side="right")]
    run_at = np.repeat(positions + before[:-1], lengths) + (
        np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(before[:-1], lengths)
    )
    total = len(rows) + int(lengths.sum())
    out: dict[str, np.ndarray | list] = {}
    for key in keys:
        values = columns[key]
        row_values = by_key[key]
        if values.dtype == np.dtype(object) or _fits(row_values, values.dtype):
            column = np.empty(total, dtype=values.dtype)
            column[run_at] = values
            column[row_at] = _objects(row_values) if values.dtype == np.dtype(object) else row_values
            out[key] = column
        else:
            mixed = np.empty(total, dtype=object)
            mixed[run_at] = _objects(values.tolist())
            mixed[row_at] = _objects(row_values)
            out[key] = mixed.tolist()
    return out


_STEP_FIELDS: tuple[str, ...] = (
    "step",
    "start_time",
    "duration_s",
    "num_seqs",
    "num_prefill_tokens",
    "num_decode_tokens",
)
_STEP_FIELDS += ("num_preempted", "num_waiting", "num_running", "grammar_time_s")


def _stats_columns(stats: list[StepStats], keys: list[str]) -> dict[str, list] | None:
    """step_row's values of these steps column by column, read from their attributes; None unless they
    are those `keys` (their cache stats all plain ints of one stats type: kv_columns)."""
    kv = kv_columns([[s.kv for s in stats]])
    if kv is None:
        return None
    columns = dict(zip(_STEP_FIELDS, map(list, zip(*map(attrgetter(*_STEP_FIELDS), stats)))))
    for name in STEP_ID_COLUMNS:
        columns[name] = [getattr(s, name) or [] for s in stats]
    columns.update((key, values.tolist()) for key, values in kv.items())  # plain ints and floats, as in rows
    return columns if list(columns) == keys else None


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
