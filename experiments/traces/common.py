"""Selection pipeline shared by all trace formats.

Format modules turn a file into `Row`s (lengths + arrival, no tokens yet, sorted by arrival);
`finalize` applies window/start/max_requests, the over-length and zero-length policies,
rebasing and time_scale, and only then builds token ids for the requests that survive.
Options (defaults, validation, paths) live in config.py and are re-exported here.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .config import COMMON_DEFAULTS, POLICIES, PROJECT_ROOT, _bad, options, plain, resolve_path
from .counter_rng import batch_request_tokens
from .types import RequestSpec, Trace, TraceError

__all__ = [
    "COMMON_DEFAULTS",
    "POLICIES",
    "PROJECT_ROOT",
    "Row",
    "finalize",
    "options",
    "plain",
    "resolve_path",
]
REPORTED = (
    "skipped.before_window",
    "skipped.before_start",
    "skipped.overlength",
    "skipped.zero_prompt",
    "skipped.zero_output",
    "clipped.overlength",
    "clipped.prompt_tokens",
    "clipped.output_tokens",
    "clipped.output_rows",
    "clipped.zero_prompt",
    "clipped.zero_output",
)


@dataclass
class Row:
    """One parsed trace row before selection; `tokens(n)` builds its first n prompt ids."""

    index: int  # position in the (sorted) source, gives request ids and token keys
    arrival_s: float  # trace clock, seconds
    prompt_len: int
    output_len: int
    line: Any  # source location for messages: line number or "entry N"
    meta: dict = field(default_factory=dict)
    tokens: Callable[[int], list[int]] | None = None  # None: per-request synthesised ids


def _policy(row: Row, opts: dict, max_model_len: int, path, stats: Counter) -> tuple[int, int] | None:
    """Apply zero-length then over-length policy; None means skip. Every change is counted."""
    p, o = row.prompt_len, row.output_len
    for what, n in (("prompt", p), ("output", o)):
        if n == 0:
            if opts["zero_length"] == "error":
                raise TraceError(f"{what} length is 0 (zero_length=error)", path, row.line, what)
            stats[f"skipped.zero_{what}" if opts["zero_length"] == "skip" else f"clipped.zero_{what}"] += 1
            if opts["zero_length"] == "skip":
                return None
    p, o = max(p, 1), max(o, 1)
    if p + o <= max_model_len:
        return p, o
    if opts["overlength"] == "error":
        raise TraceError(
            f"prompt {p} + output {o} tokens > max_model_len {max_model_len} (overlength=error)",
            path,
            row.line,
            "length",
        )
    if opts["overlength"] == "skip":
        stats["skipped.overlength"] += 1
        return None
    stats["clipped.overlength"] += 1
    new_p = max(1, max_model_len - o)  # shorten the prompt first, keeping >= 1 token
    new_o = max_model_len - new_p
    stats["clipped.prompt_tokens"] += p - new_p
    stats["clipped.output_tokens"] += o - new_o
    if new_o < o:
        stats["clipped.output_rows"] += 1
    return new_p, new_o


def finalize(
    rows: Iterable[Row],
    opts: dict,
    *,
    path: Any,
    vocab_size: int,
    max_model_len: int,
    report: dict | None = None,
) -> Trace:
    """Select, police and materialise rows (sorted by arrival) into a Trace with a report."""
    low = int(opts["token_low"])
    if vocab_size <= low + 1:
        raise _bad("token_low", f"vocab_size {vocab_size} leaves no ids above token_low {low}")
    if max_model_len < 2:
        raise TraceError(f"max_model_len must be >= 2, got {max_model_len}", "trace config")
    stats: Counter = Counter(dict.fromkeys(REPORTED, 0))  # fixed keys: reports compare easily
    window, kept, seen, last, stop = opts["window"], [], 0, -math.inf, "end_of_trace"
    for row in rows:
        stats["rows_read"] += 1
        if row.arrival_s < last:
            raise TraceError("rows not sorted by arrival (loader bug)", path, row.line)
        last = row.arrival_s
        if window is not None:
            if row.arrival_s < window[0]:
                stats["skipped.before_window"] += 1
                continue
            if window[1] is not None and row.arrival_s >= window[1]:
                stop = "window_end"
                break
        if seen < opts["start"]:
            seen += 1
            stats["skipped.before_start"] += 1
            continue
        lens = _policy(row, opts, max_model_len, path, stats)
        if lens is not None:
            kept.append((row, *lens))
            if opts["max_requests"] is not None and len(kept) >= opts["max_requests"]:
                stop = "max_requests"
                break
    if not kept:
        counts = {k: v for k, v in stats.items() if v}
        raise TraceError(f"no requests selected ({counts}); check the file, window, start, filters and policies", path)
    offset = 0.0
    if opts["rebase"]:
        offset = window[0] if window is not None else kept[0][0].arrival_s
    # Rows without their own token builder get synthesised ids, built in a few numpy batches.
    synth = [j for j, (row, _, _) in enumerate(kept) if row.tokens is None]
    idx, synth_lens = [kept[j][0].index for j in synth], [kept[j][1] for j in synth]
    batch = dict(zip(synth, batch_request_tokens(opts["seed"], idx, synth_lens, vocab_size, low)))
    reqs = []
    for j, (row, p, o) in enumerate(kept):
        ids = batch[j] if row.tokens is None else row.tokens(p)
        if not isinstance(ids, list):
            ids = ids.tolist() if hasattr(ids, "tolist") else [int(t) for t in ids]
        if len(ids) != p:  # a builder may return more than asked; never fewer
            if len(ids) < p:
                raise TraceError(f"token builder gave {len(ids)} < {p} ids (loader bug)", path, row.line)
            ids = ids[:p]
        meta = {"line": row.line, "prompt_len": row.prompt_len, "output_len": row.output_len, **row.meta}
        reqs.append(
            RequestSpec(
                f"{opts['name']}-{row.index}",
                (row.arrival_s - offset) / opts["time_scale"],
                ids,
                o,
                ignore_eos=bool(opts["ignore_eos"]),
                meta=meta,
            )
        )
    rep = {
        "format": opts["name"],
        "path": None if path is None else str(path),
        "rows_read": stats.pop("rows_read", 0),
        "requests": len(reqs),
        "stopped_at": stop,
        "skipped": {k.split(".", 1)[1]: v for k, v in stats.items() if k.startswith("skipped.")},
        "clipped": {k.split(".", 1)[1]: v for k, v in stats.items() if k.startswith("clipped.")},
        "overlength_policy": opts["overlength"],
        "zero_length_policy": opts["zero_length"],
        "max_model_len": max_model_len,
        "start": opts["start"],
        "window": window,
        "max_requests": opts["max_requests"],
        "time_scale": opts["time_scale"],
        "rebase_offset_s": offset,
        "duration_s": reqs[-1].arrival_s - reqs[0].arrival_s,
    }
    for k, v in (report or {}).items():  # format-specific counts (filters, invalid entries...)
        if k == "skipped":
            rep["skipped"].update(v)
        else:
            rep[k] = v
    return Trace(reqs, rep)
