"""A frame's arrow table as pandas makes it for to_parquet, its columns of lists converted once per stretch
of rows holding one list object: a simulation's steps table has one list object per decode run (its batch)
on each of the run's steps, so converting every row would convert each list a dozen times."""

import numpy as np
import pandas as pd
import pyarrow as pa


def frame_table(frame: pd.DataFrame) -> pa.Table:
    """`pa.Table.from_pandas(frame, preserve_index=False)`, what `to_parquet(index=False)` writes: an object
    column whose values are all lists is converted once per stretch of rows holding the same list object
    and taken to every row, of the type pyarrow infers from the same values, with pandas' metadata of the
    whole frame."""
    shared = [name for name in frame.columns if _all_lists(frame[name])]
    if not shared:
        return pa.Table.from_pandas(frame, preserve_index=False)
    rest = pa.Table.from_pandas(frame.drop(columns=shared), preserve_index=False)
    columns = [_distinct_taken(frame[name].to_numpy()) if name in shared else rest.column(name) for name in frame]
    table = pa.Table.from_arrays(columns, names=list(frame.columns))
    # pandas' metadata of these columns: pyarrow makes it from the dtypes and the arrow types
    metadata = pa.Table.from_pandas(frame.iloc[:0], schema=table.schema, preserve_index=False).schema.metadata
    return table.replace_schema_metadata(metadata)


def _all_lists(column: pd.Series) -> bool:
    return column.dtype == np.dtype(object) and len(column) > 0 and set(map(type, column.to_numpy())) == {list}


def _distinct_taken(values: np.ndarray) -> pa.Array:
    """pa.array(list(values)) for an object array of lists, converted once per stretch of rows holding the
    same list object (a run's steps are consecutive rows) and taken to every row."""
    ids = np.fromiter(map(id, values), dtype=np.uint64, count=len(values))
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    lengths = np.diff(np.append(starts, len(values)))
    return pa.array(values[starts].tolist()).take(pa.array(np.repeat(np.arange(len(starts)), lengths)))
