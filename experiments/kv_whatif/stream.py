"""The recorded block-access stream of a run (testbed.core.access_log) as a table, and back.

kv_accesses.parquet: one row per event, in order: `kind` (lookup | cache | release), `request_id` and
`num_tokens` (lookups only), `hashes` (a list: a lookup's eligible prompt-block hashes, first block first;
the one hash of a cache or release; empty for the release of a block holding no full prefix).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

FILE = "kv_accesses.parquet"


def access_frame(log) -> pd.DataFrame:
    kinds, rids, ntoks, hashes = log.columns()
    df = pd.DataFrame({"kind": kinds, "request_id": rids, "num_tokens": ntoks, "hashes": hashes})
    df["num_tokens"] = df["num_tokens"].astype("Int64")
    return df


def read_accesses(run_dir: str | Path) -> pd.DataFrame:
    path = Path(run_dir) / FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no block-access stream; record one with metrics.kv_access_log=true (paged KV cache, one engine)"
        )
    with open(path, "rb") as f:
        return pd.read_parquet(f)
