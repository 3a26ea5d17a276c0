"""The steps table made from decode runs' column arrays and step rows equals the table of every row
(Recorder.steps), dtypes included, wherever the runs fall among the rows and whatever the rows hold."""

import dataclasses

import pandas as pd
import pytest

import experiments.results.recorder as recorder_module
import experiments.results.step_columns as step_columns_module
from experiments.results.recorder import Recorder
from experiments.results.step_rows import step_row
from testbed.core.allocators.base import KVCacheStats
from testbed.core.allocators.counter_spans import CounterSpans
from testbed.step_stats import StepRun, StepStats, kv_compact


def kv(used: int) -> KVCacheStats:
    return KVCacheStats(100, 16, used, used * 16 - 3, 3, 2, 100 - used, used * 16 - 3, 1, 2, 0, (100 - used) * 16)


def row(step: int, **changes) -> StepStats:
    fields = dict(
        step=step,
        start_time=step * 0.5,
        duration_s=0.25,
        num_seqs=2,
        num_prefill_tokens=30,
        num_decode_tokens=1,
        num_preempted=0,
        num_waiting=1,
        num_running=2,
        kv=kv(step % 7 + 1),
        grammar_time_s=0.0,
        scheduled_ids=["a", "b"],
        scheduled_tokens=[30, 1],
        prefill_ids=["a"],
    )
    return StepStats(**(fields | changes))


def run(first: int, k: int, finished: int = 0, spans: bool = False) -> StepRun:
    """k steps of three requests, `finished` of them ending in the last; the cache's state a tuple per
    step, or (spans) counters that change halfway (as a simulated decode run notes them)."""
    starts = [first * 0.5 + 0.1 * j for j in range(k)]
    ends = [t + 0.075 for t in starts]
    kvs: list | CounterSpans = [kv_compact(kv(j % 5 + 1)) for j in range(k)]
    if spans:
        kvs = CounterSpans(100, 16, 3)
        kvs.add(k // 2, 40 + first, (60, 2, 40, 5))
        kvs.add(k - k // 2, 40 + first + 3 * (k // 2), (58, first % 3, 42, 7))
    return StepRun(first, starts, ends, kvs, 3, ["a", "b", "c"], 0.125, num_finished=finished)


@pytest.mark.parametrize(
    "layout,changes",
    [
        ("RrRrrRR", {}),  # runs first, between rows, consecutive, last
        ("rRr", {}),
        ("RR", {}),
        ("rRrr", {"grammar_time_s": 0}),  # an int among a float column's values: one list, pandas infers
        ("Rr", {"num_waiting": 2**64}),  # beyond int64
        ("RRr", {"num_preempted": None}),  # a missing value
        ("SrSSr", {}),  # the cache's state as counter spans
        ("rSRrS", {}),  # spans and tuples: the columns made from tuples
        ("SSr", {"num_waiting": 2**64}),
    ],
)
@pytest.mark.parametrize("keep", [False, True])  # StepStats kept as they are (an attached recorder)
def test_columns_equal_rows(layout, changes, keep, monkeypatch):
    recorder, step = Recorder(), 1
    recorder.keep_stats = keep
    for i, kind in enumerate(layout):
        if kind in "RS":
            r = run(step, 3 + i, finished=i % 3, spans=kind == "S")  # their last steps end 0, 1 or 2 requests
            recorder.on_run(r)
        else:
            recorder.on_step(row(step, **(changes if i == len(layout) - 1 else {})))
        step += len(r) if kind in "RS" else 1
    assert recorder._kept == (layout.count("r") if keep else 0)
    made = []  # rows made while the table is: none, kept StepStats are read column by column
    for module in (recorder_module, step_columns_module):  # everywhere the table makes rows
        monkeypatch.setattr(module, "step_row", lambda stats: made.append(stats) or step_row(stats))
    columns = recorder.steps_frame()
    assert not made
    monkeypatch.undo()
    rows = pd.DataFrame(recorder.steps)
    assert not recorder._runs and not recorder._kept and len(rows) == step - 1
    assert (rows["num_running"] < rows["num_seqs"]).sum() == sum(i % 3 > 0 for i, k in enumerate(layout) if k in "RS")
    assert list(columns.dtypes) == list(rows.dtypes)
    assert columns.equals(rows)


@pytest.mark.parametrize("odd", [2.5, True, None])
@pytest.mark.parametrize("where", ["run", "step"])
def test_cache_stats_not_all_plain_ints(odd, where):
    """A run or a kept step whose cache stats hold anything but plain ints (a float, a bool, None): the
    same table as its rows give (the columns are then made from rows)."""
    recorder = Recorder()
    recorder.keep_stats = True
    odd_kv = dataclasses.replace(kv(1), free_blocks=odd) if where == "step" else kv(1)
    recorder.on_step(row(1, kv=odd_kv))
    recorder.on_step(row(4))
    odd_stats = dataclasses.replace(kv(3), used_token_slots=odd) if where == "run" else kv(3)
    recorder.on_run(StepRun(2, [1.0, 1.1], [1.05, 1.15], [kv_compact(kv(2)), kv_compact(odd_stats)], 3, ["a"], 0.0))
    assert recorder._kept == 2
    columns = recorder.steps_frame()
    rows = pd.DataFrame(recorder.steps)
    assert list(columns.dtypes) == list(rows.dtypes)
    assert columns.equals(rows)


@pytest.mark.parametrize("odd", [True, 2**62])
def test_counter_spans_not_plain_ints_in_range(odd):
    """Counter spans made of anything but plain ints in range (a bool; one whose products would leave
    int64's range): the same table as their rows give."""
    recorder = Recorder()
    recorder.on_step(row(1))
    recorder.on_run(run(2, 4, spans=True))
    odd_spans = CounterSpans(100, 16, 3)
    odd_spans.add(2, 40, (60, odd, 40, 5))
    recorder.on_run(StepRun(6, [3.0, 3.1], [3.05, 3.15], odd_spans, 3, ["a"], 0.0, num_finished=1))
    columns = recorder.steps_frame()
    rows = pd.DataFrame(recorder.steps)
    assert list(columns.dtypes) == list(rows.dtypes)
    assert columns.equals(rows)
