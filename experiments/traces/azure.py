"""Azure LLM inference traces (2023 code/conversation, 2024 week-long): CSV with
TIMESTAMP (e.g. `2023-11-16 18:15:46.6805900`, 2024 adds `+00:00`), ContextTokens, GeneratedTokens.

Arrival = seconds since the first row. Prompts are synthesised (the trace holds lengths only).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .common import finalize, options, resolve_path
from .tabular import check_horizon, numeric, read_csv, sorted_rows
from .types import Trace, TraceError

DEFAULTS = {"path": None}
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def parse_timestamps(values: pd.Series, path, col: str = "TIMESTAMP") -> np.ndarray:
    """Seconds since the earliest timestamp; naive times are taken as UTC. Bad values name the line."""
    ts = pd.to_datetime(values.str.strip(), format="ISO8601", utc=True, errors="coerce")
    bad = ts.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(f"not a timestamp: {values.iloc[i]!r}", path, i + 2, col)
    # Differences (not epoch floats) keep sub-microsecond precision; pandas picks the time unit
    # from the input (us for 6 digits, ns for 7), so never read the raw integers.
    return (ts - ts.min()).dt.total_seconds().to_numpy()


def load(cfg: Any, vocab_size: int, max_model_len: int, tokenizer=None) -> Trace:
    opts = options(cfg, DEFAULTS)
    path = resolve_path(opts["path"])
    df = read_csv(path, COLUMNS)
    arrival = parse_timestamps(df["TIMESTAMP"], path)
    prompt = numeric(df["ContextTokens"], "ContextTokens", path, integer=True)
    output = numeric(df["GeneratedTokens"], "GeneratedTokens", path, integer=True)
    lines = np.arange(len(df)) + 2
    check_horizon(arrival, lines, path, "TIMESTAMP", opts["horizon_s"])
    report: dict = {"rows_in_file": len(df)}
    rows = sorted_rows(arrival, prompt, output, lines, report=report)
    return finalize(rows, opts, path=path, vocab_size=vocab_size, max_model_len=max_model_len, report=report)
