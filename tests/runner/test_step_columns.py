"""The steps table's columns made from arrays (decode runs) and row values: the dtype and values pandas
gives the same values as one Python list, whatever the rows hold."""

import numpy as np
import pandas as pd
import pytest

from experiments.recorder import _column


def as_list(parts) -> list:
    out: list = []
    for part in parts:
        out += part.tolist() if isinstance(part, np.ndarray) and part.dtype != object else list(part)
    return out


def runs_of(value, k: int) -> np.ndarray:
    column = np.empty(k, dtype=object)
    column.fill(value)
    return column


@pytest.mark.parametrize(
    "parts",
    [
        [[1, 2], np.arange(3, 6, dtype=np.int64), [7]],  # ints: one int64 array
        [[0.5], np.array([1.5, 2.5]), [3.0, 4.25]],  # floats
        [[0.0, 1], np.array([1.5])],  # an int among floats: pandas' own inference
        [[True], np.arange(2, dtype=np.int64)],  # a bool is not an int64 row value
        [[2**63], np.arange(2, dtype=np.int64)],  # beyond int64
        [[None, 3], np.arange(2, dtype=np.int64)],  # a missing value
        [[["a", "b"], []], runs_of(["c"], 3), [["d"]]],  # list columns stay lists
        [np.arange(4, dtype=np.int64)],
    ],
)
def test_columns_equal_pandas_on_the_list(parts):
    expected = pd.Series(as_list(parts))
    got = pd.Series(_column(parts))
    assert got.dtype == expected.dtype
    assert got.equals(expected)
