"""BurstGPT traces: CSV with Timestamp (s), Model, Request tokens, Response tokens,
Total tokens, Log Type, and in some releases Session ID, Elapsed time.

Arrival = Timestamp minus the file's earliest Timestamp (before filtering, so windows refer to
the same clock whatever the filter). Response tokens = 0 marks a failed request: the zero_length
policy decides (clip to 1 token, skip or error).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .common import finalize, options, resolve_path
from .tabular import check_horizon, numeric, read_csv, sorted_rows
from .types import Trace, TraceError

DEFAULTS = {"path": None, "models": None, "log_types": None}  # null = keep all
REQUIRED = ("Timestamp", "Request tokens", "Response tokens")
CARRIED = {
    "Model": "model",
    "Log Type": "log_type",
    "Session ID": "session_id",
    "Elapsed time": "elapsed_time",
    "Total tokens": "total_tokens",
}
NUMERIC = ("Elapsed time", "Total tokens")


def _as_list(opt: str, v: Any) -> list[str] | None:
    if v is None:
        return None
    vals = [v] if isinstance(v, str) else v
    if not isinstance(vals, list) or not vals or not all(isinstance(x, str) for x in vals):
        raise TraceError(f"must be null, a string or a list of strings, got {v!r}", "trace config", field=opt)
    return vals


def load(cfg: Any, vocab_size: int, max_model_len: int, tokenizer=None) -> Trace:
    opts = options(cfg, DEFAULTS)
    filters = {
        "Model": _as_list("models", opts["models"]),
        "Log Type": _as_list("log_types", opts["log_types"]),
    }
    path = resolve_path(opts["path"])
    df = read_csv(path, REQUIRED + tuple(c for c, v in filters.items() if v is not None))
    ts = numeric(df["Timestamp"], "Timestamp", path, integer=False)
    check_horizon(ts - ts.min(), np.arange(len(df)) + 2, path, "Timestamp", opts["horizon_s"])
    prompt = numeric(df["Request tokens"], "Request tokens", path, integer=True)
    output = numeric(df["Response tokens"], "Response tokens", path, integer=True)
    keep = np.ones(len(df), dtype=bool)
    skipped = {}
    for col, wanted in filters.items():
        if wanted is None:
            continue
        col_vals = df[col].str.strip()
        present = set(col_vals.unique())
        if not set(wanted) & present:  # most likely a typo: say what the file has
            raise TraceError(f"no row matches {wanted}; values present: {sorted(present)[:20]}", path, field=col)
        hit = col_vals.isin(wanted).to_numpy()
        skipped[f"filtered_{CARRIED[col]}"] = int((keep & ~hit).sum())
        keep &= hit
    sel = np.flatnonzero(keep)
    carried = [(c, k) for c, k in CARRIED.items() if c in df.columns]
    # Numbers stay numbers in meta (NaN where the cell is not one); labels stay strings.
    columns = {
        c: (pd.to_numeric(df[c], errors="coerce") if c in NUMERIC else df[c].str.strip()).to_numpy() for c, _ in carried
    }

    def meta(i: int) -> dict:
        return {k: columns[c][sel[i]].item() if c in NUMERIC else columns[c][sel[i]] for c, k in carried}

    report: dict = {
        "rows_in_file": len(df),
        "rows_after_filters": len(sel),
        "skipped": skipped,
        "models": filters["Model"],
        "log_types": filters["Log Type"],
    }
    rows = sorted_rows((ts - ts.min())[sel], prompt[sel], output[sel], sel + 2, meta=meta, report=report)
    return finalize(rows, opts, path=path, vocab_size=vocab_size, max_model_len=max_model_len, report=report)
