"""The recorded block-access stream of a run (testbed.core.access_log) as a table, and back.

kv_accesses.parquet: one row per event, in order: `kind` (lookup | cache | release), `request_id` and
`num_tokens` (lookups only), `hashes` (a list: a lookup's eligible prompt-block hashes, first block first;
the one hash of a cache or release; empty for the release of a block holding no full prefix).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from experiments.results.arrow_pool import system_memory_pool
from testbed.core.access_log import KINDS

FILE = "kv_accesses.parquet"


def access_table(log) -> pa.Table:
    """The stream as the arrow table pandas makes of its frame (`pa.Table.from_pandas(frame,
    preserve_index=False)`: kind, request_id, num_tokens as Int64, hashes as a column of lists, with
    pandas' metadata), what `to_parquet` writes. A run has millions of block events: the columns are made
    from the log's arrays (KVAccessLog.arrays: no Python object per event, no frame of them first), the
    string columns by arrow's take, the hash lists as one list array from the hashes laid end to end;
    arrow's buffers from malloc (experiments.results.arrow_pool)."""
    with system_memory_pool():
        return _access_table(log)


def _access_table(log) -> pa.Table:
    arrays = log.arrays()
    if arrays is None or not len(arrays[1]) or not len(arrays[4]) or len(arrays[4]) > np.iinfo(np.int32).max:
        # no lookup (request_id all null), no hash (list<null>), offsets past int32: pandas infers other types
        kinds, request_ids, num_tokens, hashes = log.columns()
        frame = pd.DataFrame({"kind": kinds, "request_id": request_ids, "num_tokens": num_tokens})
        frame["num_tokens"] = frame["num_tokens"].astype("Int64")
        return pa.Table.from_pandas(frame.assign(hashes=hashes), preserve_index=False)
    codes, lookup_at, request_ids, num_tokens, values, counts = arrays
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    lookup_of = np.full(len(codes), -1, dtype=np.int64)  # each event's lookup, -1: a block event (null)
    lookup_of[lookup_at] = np.arange(len(lookup_at))
    missing = lookup_of < 0
    table = pa.table(
        {
            # the types pandas gives these columns (str: large_string; Int64: int64), None as null
            "kind": pa.array(KINDS, type=pa.large_string()).take(pa.array(codes)),
            "request_id": pa.array(request_ids, type=pa.large_string()).take(pa.array(lookup_of, mask=missing)),
            "num_tokens": pa.array(num_tokens, type=pa.int64()).take(pa.array(lookup_of, mask=missing)),
            "hashes": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),  # list<int64>, as inferred
        }
    )
    # pandas' metadata of the frame's columns: pyarrow makes it from dtypes and arrow types
    stub = pd.DataFrame(
        {
            "kind": pd.Series([KINDS[codes[0]]], dtype="str"),
            "request_id": pd.Series(["?"], dtype="str"),
            "num_tokens": pd.Series([0], dtype="Int64"),
            "hashes": pd.Series([[]], dtype=object),
        }
    ).iloc[:0]
    metadata = pa.Table.from_pandas(stub, schema=table.schema, preserve_index=False).schema.metadata
    return table.replace_schema_metadata(metadata)


def read_accesses(run_dir: str | Path) -> pd.DataFrame:
    path = Path(run_dir) / FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no block-access stream; record one with metrics.kv_access_log=true (paged KV cache, one engine)"
        )
    with open(path, "rb") as f:
        return pd.read_parquet(f)
