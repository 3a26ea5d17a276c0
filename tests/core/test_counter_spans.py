"""A decode run notes the cache's state from the counters it read where blocks were taken
(testbed.core.allocators.counter_spans): each step's state is compact_stats at that step's computed
tokens with those counters, step by step, one step at a time, and as the steps table's int64 columns of
many runs at once; anything but plain ints in range is refused by the columns (the recorder then makes
them from the tuples)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.core.allocators.counter_spans import CounterSpans, stats_table
from testbed.core.allocators.paged import PagedAllocator
from testbed.request import Request
from testbed.sampling_params import SamplingParams


def test_spans_equal_compact_stats_at_each_step():
    kv = PagedAllocator(20, 4, True)
    r = Request("r", list(range(10)), SamplingParams(max_tokens=5))
    kv.allocate_slots(r, 10)
    r.num_computed_tokens = 10
    before, stats_before = kv.counters(), [kv.compact_stats(7 + 3 * k) for k in range(6)]
    assert before == (17, 0, 3, 0)  # three blocks held: the counters are read, not assumed
    r.num_computed_tokens = 12
    kv.allocate_slots(r, 1)  # a fourth block
    after, stats_after = kv.counters(), [kv.compact_stats(7 + 3 * k) for k in range(6)]
    assert after == (16, 0, 4, 1)
    spans = kv.counter_spans(3)
    for first, count, counters in [(0, 2, before), (2, 0, after), (2, 3, after), (5, 1, before)]:
        spans.add(count, 7 + 3 * first, counters)
    expected = stats_before[:2] + stats_after[2:5] + stats_before[5:]
    assert spans.tuples() == list(spans) == expected
    assert [spans[j] for j in range(6)] == expected and spans[-1] == expected[-1] and len(spans) == 6
    with pytest.raises(IndexError):
        spans[6]
    assert np.array_equal(stats_table([spans]), np.array(expected).T)
    constant = kv.counter_spans(0)
    constant.add(2, 7, after)
    assert list(constant) == [kv.compact_stats(7)] * 2
    assert list(kv.counter_spans(3)) == []


counters = st.tuples(*[st.integers(0, 5000)] * 4)
spans_of_run = st.lists(st.tuples(st.integers(0, 40), st.integers(-100, 10**6), counters), max_size=6)
runs = st.lists(st.tuples(st.integers(1, 10**5), st.integers(1, 64), st.integers(0, 300), spans_of_run), max_size=5)


def made(run) -> CounterSpans:
    num_blocks, block_size, per_step, spans = run
    out = CounterSpans(num_blocks, block_size, per_step)
    for count, computed, values in spans:
        out.add(count, computed, values)
    return out


@given(runs)
def test_table_equals_each_steps_tuple(runs):
    """stats_table of many runs: their steps' tuples, one run after another, as columns; each step's
    tuple also by index."""
    made_runs = [made(run) for run in runs]
    tuples = [t for spans in made_runs for t in spans.tuples()]
    table = stats_table(made_runs)
    assert table is not None and table.dtype == np.int64
    assert table.shape == (12, len(tuples))
    assert table.T.tolist() == [list(t) for t in tuples]
    for spans in made_runs:
        assert [spans[j] for j in range(len(spans))] == spans.tuples()


@pytest.mark.parametrize("odd", [True, 2.0, np.int64(3), 2**30, -(2**30) - 1])
@pytest.mark.parametrize("where", ["counter", "computed", "block_size"])
def test_table_refuses_anything_but_plain_ints_in_range(odd, where):
    spans = CounterSpans(100, odd if where == "block_size" else 16, 4)
    spans.add(3, 10, (50, 1, 40, 2))
    spans.add(2, odd if where == "computed" else 22, (odd, 1, 40, 2) if where == "counter" else (49, 1, 41, 2))
    assert stats_table([CounterSpans(100, 16, 4), spans]) is None
    good = CounterSpans(100, 16, 4)
    good.add(2, 2**30 - 1, (50, 1, 40, 2))
    assert stats_table([good]) is not None
