"""Mooncake FAST'25 traces (synthetic / conversation / toolagent): JSONL with
timestamp (ms), input_length, output_length, hash_ids (ids of block_size-token prompt blocks).

Equal hash ids get identical token blocks, so prefix caching sees the trace's real reuse.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .common import finalize, options, resolve_path
from .config import INT64_MAX
from .counter_rng import BlockTokens
from .tabular import check_horizon, sorted_rows
from .types import Trace, TraceError

DEFAULTS = {"path": None, "block_size": 512}  # tokens per hash id in the released traces


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _field(rec: dict, key: str, path, line: int, *, integer: bool) -> float:
    if key not in rec:
        raise TraceError(f"missing field; record has {sorted(rec)[:20]}", path, line, key)
    v = rec[key]
    ok = _is_int(v) or (not integer and isinstance(v, float) and np.isfinite(v))
    if isinstance(v, float) and integer and np.isfinite(v) and v == int(v):
        ok, v = True, int(v)  # 12.0 is an acceptable length
    if not ok:
        raise TraceError(f"expected {'an integer' if integer else 'a number'}, got {str(v)[:60]!r}", path, line, key)
    if v < 0:
        raise TraceError(f"negative value: {v!r}", path, line, key)
    if _is_int(v) and v > INT64_MAX:  # corrupt, not long: it would wrap around in int64 (or not fit a float)
        raise TraceError(f"outside the int64 range: {str(v)[:40]}...", path, line, key)
    return v


def _record(raw: bytes, path, line_no: int):
    """One JSONL line as an object; every way it can be bad is a TraceError naming the line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"not UTF-8 text ({e.reason} at byte {e.start}): a binary file?", path, line_no) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"malformed JSON: {e.msg} (column {e.colno})", path, line_no) from None
    except RecursionError:
        raise TraceError("JSON nested too deeply", path, line_no) from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise TraceError(f"unreadable JSON value: {e}", path, line_no) from None


def parse(path) -> tuple[list, list, list, list, list]:
    """(timestamps_ms, input_lengths, output_lengths, hash_ids, line numbers) of every record."""
    if not path.is_file():
        raise TraceError("file not found (looked relative to the cwd and the project root)", path)
    ts, inp, out, hashes, lines = [], [], [], [], []
    with open(path, "rb") as f:  # bytes: a decoding error then names its line
        for line_no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue  # blank lines (e.g. a trailing one) are not records
            rec = _record(raw, path, line_no)
            if not isinstance(rec, dict):
                raise TraceError(f"expected a JSON object, got {type(rec).__name__}", path, line_no)
            ts.append(_field(rec, "timestamp", path, line_no, integer=False))
            inp.append(_field(rec, "input_length", path, line_no, integer=True))
            out.append(_field(rec, "output_length", path, line_no, integer=True))
            h = rec.get("hash_ids")
            if not isinstance(h, list) or not all(_is_int(x) and -INT64_MAX - 1 <= x <= INT64_MAX for x in h):
                raise TraceError(f"expected a list of int64 integers, got {str(h)[:60]!r}", path, line_no, "hash_ids")
            hashes.append(h)
            lines.append(line_no)
    if not lines:
        raise TraceError("no records (empty file)", path)
    return ts, inp, out, hashes, lines


def load(cfg: Any, vocab_size: int, max_model_len: int, tokenizer=None) -> Trace:
    opts = options(cfg, DEFAULTS)
    bs = opts["block_size"]
    if not _is_int(bs) or bs < 1:
        raise TraceError(f"must be an integer >= 1, got {bs!r}", "trace config", field="block_size")
    path = resolve_path(opts["path"])
    ts, inp, out, hashes, lines = parse(path)
    seed, low = opts["seed"], opts["token_low"]
    # Lengths that disagree with the number of ids are kept as given: missing blocks are filled
    # with per-request tokens, surplus ids ignored. Counted so the mismatch is visible.
    report: dict = {
        "rows_in_file": len(lines),
        "block_size": bs,
        "hash_len_mismatch": sum(-(-n // bs) != len(h) for n, h in zip(inp, hashes)),
    }

    def meta(i: int) -> dict:
        return {"hash_ids": hashes[i], "timestamp_ms": ts[i]}

    blocks = BlockTokens(seed, bs, vocab_size, low)

    def tokens(i: int):
        return lambda n: blocks.build(hashes[i], n, index=i)

    clock = np.asarray(ts, dtype=float) / 1000.0
    clock -= clock.min()
    check_horizon(clock, lines, path, "timestamp", opts["horizon_s"])
    rows = sorted_rows(
        clock,
        np.asarray(inp),
        np.asarray(out),
        np.asarray(lines),
        meta=meta,
        tokens=tokens,
        report=report,
    )
    return finalize(rows, opts, path=path, vocab_size=vocab_size, max_model_len=max_model_len, report=report)
