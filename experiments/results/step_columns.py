"""The steps table's columns made directly from decode runs kept whole (testbed.step_stats.StepRun) and
step rows: the same table, dtypes included, as pandas makes from every step's row (step_rows.step_row),
without making a row per step."""

from __future__ import annotations

import dataclasses
from itertools import chain
from operator import attrgetter, itemgetter

import numpy as np

from experiments.results.step_rows import STEP_ID_COLUMNS, dataclass_columns, step_row
from testbed.core.allocators.counter_spans import CounterSpans, stats_table
from testbed.step_stats import KV_FIELDS, StepRun, StepStats, kv_stats_of


def runs_columns(runs: list[StepRun]) -> dict[str, np.ndarray]:
    """Decode runs' rows (testbed.step_stats.StepRun), all runs one after the other, as column arrays equal
    to step_row of each step up to the cache's (kv_columns): the same numbers, in the dtypes pandas gives
    their Python values; list columns hold each run's own lists (nobody writes into a step row's)."""
    lengths = np.array([len(run) for run in runs], dtype=np.int64)
    firsts = np.cumsum(lengths) - lengths  # where each run starts in the columns
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(firsts, lengths)
    total = int(lengths.sum())
    starts = np.fromiter(chain.from_iterable(run.start_times for run in runs), dtype=np.float64, count=total)
    ends = np.fromiter(chain.from_iterable(run.end_times for run in runs), dtype=np.float64, count=total)
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
        getter, keys = dataclass_columns(kind)
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
