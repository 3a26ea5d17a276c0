"""CSV/array helpers for the length-only formats (Azure, BurstGPT, Mooncake)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .common import Row
from .config import INT64_MAX
from .types import TraceError


def read_csv(path: Path, required: Sequence[str]) -> pd.DataFrame:
    """All-string frame with stripped headers; line numbers: header = line 1, row i = line i + 2."""
    if not path.is_file():
        raise TraceError("file not found (looked relative to the cwd and the project root)", path)
    try:
        with warnings.catch_warnings():
            # index_col=False: extra fields must not silently become an index; pandas then only
            # warns about them, so make that an error too.
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True, index_col=False)
    except pd.errors.EmptyDataError:
        raise TraceError("empty file (no header)", path) from None
    except (pd.errors.ParserError, pd.errors.ParserWarning, UnicodeDecodeError) as e:
        raise TraceError(f"malformed CSV: {e}", path) from None
    df.columns = [str(c).strip() for c in df.columns]
    for col in required:
        if col not in df.columns:
            raise TraceError(f"missing column; header has {list(df.columns)}", path, 1, col)
    if df.empty:
        raise TraceError("no data rows", path)
    return df


def numeric(values: Any, col: str, path: Path, *, integer: bool, line_offset: int = 2) -> np.ndarray:
    """Finite numbers (integers if asked), >= 0; else TraceError naming line and field."""
    raw = pd.Series(values)
    nums = pd.to_numeric(raw.astype(str).str.strip(), errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(nums)
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(f"not a finite number: {raw.iloc[i]!r}", path, i + line_offset, col)
    if integer and (nums != np.round(nums)).any():
        i = int(np.argmax(nums != np.round(nums)))
        raise TraceError(f"not an integer: {raw.iloc[i]!r}", path, i + line_offset, col)
    if (nums < 0).any():
        i = int(np.argmax(nums < 0))
        raise TraceError(f"negative value: {raw.iloc[i]!r}", path, i + line_offset, col)
    if integer and (nums > INT64_MAX).any():  # would wrap around to negative in int64: corrupt, not long
        i = int(np.argmax(nums > INT64_MAX))
        raise TraceError(f"outside the int64 range: {raw.iloc[i]!r}", path, i + line_offset, col)
    return nums.astype(np.int64) if integer else nums


def check_horizon(arrival: np.ndarray, lines, path, col: str, horizon_s: float | None) -> None:
    """Refuse arrivals (seconds since the earliest) beyond horizon_s: a corrupt timestamp (1e308, year
    2200) would otherwise make the replay wait for ever or overflow later."""
    if horizon_s is None or not len(arrival):
        return
    late = arrival > horizon_s
    if late.any():
        i, first = int(np.argmax(late)), lines[int(np.argmin(arrival))]
        first = f"line {first}" if isinstance(first, (int, np.integer)) else first
        raise TraceError(
            f"arrives {arrival[i]:.4g} s after the earliest request ({first}), beyond trace.horizon_s="
            f"{horizon_s:g}: a corrupt timestamp or rate? (raise trace.horizon_s for longer traces)",
            path,
            lines[i],
            col,
        )


def sorted_rows(
    arrival: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    lines: np.ndarray,
    meta: Callable[[int], dict] | None = None,
    tokens: Callable[[int], Callable[[int], Any]] | None = None,
    report: dict | None = None,
) -> Iterator[Row]:
    """Rows stably sorted by arrival (already on the trace clock: seconds since the file's start).

    meta(i) / tokens(i) receive the original (file-order) position i; Row.index is the sorted
    position, so request ids follow arrival order.
    """
    if report is not None:
        report["rows_out_of_order"] = int((np.diff(arrival) < 0).sum()) if len(arrival) > 1 else 0
    order = np.argsort(arrival, kind="stable")
    for k, i in enumerate(order.tolist()):
        yield Row(
            index=k,
            arrival_s=float(arrival[i]),
            prompt_len=int(prompt[i]),
            output_len=int(output[i]),
            line=int(lines[i]),
            meta=meta(i) if meta else {},
            tokens=tokens(i) if tokens else None,
        )
