"""experiments.results.list_columns.frame_table: the table a frame with shared list objects is written from
gives the very bytes `to_parquet(index=False)` writes, whatever its list columns hold."""

import io

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from experiments.results.list_columns import frame_table


def written(frame: pd.DataFrame, through_table: bool) -> bytes:
    out = io.BytesIO()
    if through_table:
        pq.write_table(frame_table(frame), out, compression="snappy")  # as files.write_parquet writes tables
    else:
        frame.to_parquet(out, index=False)
    return out.getvalue()


def steps_like(seed: int, rows: int) -> pd.DataFrame:
    """Step rows as a simulation's steps table has them: runs of steps sharing one batch list, full steps
    with their own lists, empty lists shared, a float and an int column, a string column."""
    rng = np.random.default_rng(seed)
    ids, tokens, empty, prefill = [], [], [], []
    shared_empty: list = []
    while len(ids) < rows:
        batch = [f"r{int(k)}" for k in rng.integers(0, 50, size=int(rng.integers(0, 6)))]
        counts = [int(c) for c in rng.integers(1, 9, size=len(batch))]
        steps = int(rng.integers(1, 12))
        if rng.random() < 0.3:  # a full step: lists of its own
            ids.append(list(batch))
            tokens.append(list(counts))
            empty.append([])
            prefill.append(batch[:1])
        else:  # a run: the same objects on each step
            ids += [batch] * steps
            tokens += [counts] * steps
            empty += [shared_empty] * steps
            prefill += [shared_empty] * steps
    n = len(ids)
    return pd.DataFrame(
        {
            "step": np.arange(n, dtype=np.int64),
            "start_time": rng.random(n),
            "scheduled_ids": pd.Series(ids, dtype=object),
            "scheduled_tokens": pd.Series(tokens, dtype=object),
            "kind": [f"k{i % 3}" for i in range(n)],
            "preempted_ids": pd.Series(empty, dtype=object),
            "prefill_ids": pd.Series(prefill, dtype=object),
        }
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_steps_like_frames_write_the_same_bytes(seed):
    frame = steps_like(seed, 3000)
    assert written(frame, True) == written(frame, False)


def test_edge_frames_write_the_same_bytes():
    shared = ["a", "b"]
    frames = [
        pd.DataFrame({"x": [1, 2, 3]}),  # no list column
        pd.DataFrame({"x": pd.Series([], dtype="int64"), "ids": pd.Series([], dtype=object)}),  # no rows
        pd.DataFrame({"ids": pd.Series([[], [], []], dtype=object), "x": [1, 2, 3]}),  # only empty lists
        pd.DataFrame({"ids": pd.Series([shared, shared, ["c"]], dtype=object)}),  # one list column first
        pd.DataFrame({"ids": pd.Series([shared] * 3, dtype=object), "o": pd.Series(["s", None, "t"], dtype=object)}),
        pd.DataFrame({"big": pd.Series([[2**40, -1], [3]] * 4, dtype=object), "ids": pd.Series([shared] * 8)}),
    ]
    for frame in frames:
        assert written(frame, True) == written(frame, False), frame.columns.tolist()
