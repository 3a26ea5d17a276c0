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

FILE = "kv_accesses.parquet"


def access_table(log) -> pa.Table:
    """The stream as the arrow table pandas makes of its frame (`pa.Table.from_pandas(frame,
    preserve_index=False)`: kind, request_id, num_tokens as Int64, hashes as a column of lists, with
    pandas' metadata), what `to_parquet` writes. A run has millions of block events: the hash lists are
    made as one arrow list array from the hashes laid end to end, not as a Python list per event."""
    kinds, request_ids, num_tokens, values, counts = log.flat_columns()
    frame = pd.DataFrame({"kind": kinds, "request_id": request_ids, "num_tokens": num_tokens})
    frame["num_tokens"] = frame["num_tokens"].astype("Int64")
    if not values or len(values) > np.iinfo(np.int32).max:  # pyarrow infers these columns' types otherwise
        hashes, at = [], 0
        for count in counts:
            hashes.append(values[at : at + count])
            at += count
        return pa.Table.from_pandas(frame.assign(hashes=hashes), preserve_index=False)
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))  # list<int64>, as pyarrow infers
    table = pa.Table.from_pandas(frame, preserve_index=False).append_column("hashes", lists)
    # pandas' metadata of these columns, hashes an object column: pyarrow makes it from dtypes and arrow types
    stub = frame.iloc[:0].assign(hashes=pd.Series([], dtype=object))
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
