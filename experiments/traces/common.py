"""Options and selection pipeline shared by all trace formats.

Format modules turn a file into `Row`s (lengths + arrival, no tokens yet, sorted by arrival);
`finalize` applies window/start/max_requests, the over-length and zero-length policies,
rebasing and time_scale, and only then builds token ids for the requests that survive.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .spec import RequestSpec, Trace, TraceError
from .synth import batch_request_tokens

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the directory holding experiments/
POLICIES = ("clip", "skip", "error")
REPORTED = ("skipped.before_window", "skipped.before_start", "skipped.overlength", "skipped.zero_prompt",
            "skipped.zero_output", "clipped.overlength", "clipped.prompt_tokens", "clipped.output_tokens",
            "clipped.output_rows", "clipped.zero_prompt", "clipped.zero_output")

COMMON_DEFAULTS: dict[str, Any] = {
    "name": None,
    "start": 0,             # skip this many rows (after the window)
    "window": None,         # [start_s, end_s) on the trace clock; end_s may be null (open)
    "max_requests": None,   # stop after this many requests are kept
    "time_scale": 1.0,      # rate multiplier: arrival times are divided by it
    "seed": 0,              # token ids and any synthesised arrivals/lengths
    "overlength": "clip",   # prompt + output > max_model_len: clip | skip | error
    "zero_length": None,    # 0-token prompt/output: clip (to 1) | skip | error; null = overlength
    "rebase": True,         # shift arrivals so the selection starts at 0 (the window start if any)
    "ignore_eos": True,
    "token_low": 100,       # synthesised ids are drawn from [token_low, vocab_size): no special ids
}


@dataclass
class Row:
    """One parsed trace row before selection; `tokens(n)` builds its first n prompt ids."""

    index: int              # position in the (sorted) source, gives request ids and token keys
    arrival_s: float        # trace clock, seconds
    prompt_len: int
    output_len: int
    line: Any               # source location for messages: line number or "entry N"
    meta: dict = field(default_factory=dict)
    tokens: Callable[[int], list[int]] | None = None  # None: per-request synthesised ids


def plain(obj: Any) -> Any:
    """DictConfig/ListConfig/Mappings -> plain dicts and lists (values resolved)."""
    try:
        from omegaconf import OmegaConf
        if OmegaConf.is_config(obj):
            return OmegaConf.to_container(obj, resolve=True)
    except ImportError:  # omegaconf is optional for programmatic use
        pass
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


def options(cfg: Any, fmt_defaults: Mapping[str, Any]) -> dict:
    """Merge defaults with cfg, rejecting unknown keys (a typo must not be silently ignored)."""
    cfg = plain(cfg) or {}
    allowed = {**COMMON_DEFAULTS, **fmt_defaults}
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        raise TraceError(f"unknown trace option(s) {unknown}; allowed: {sorted(allowed)}",
                         "trace config")
    opts = {**allowed, **cfg}
    _check_common(opts)
    return opts


def _bad(key: str, msg: str) -> TraceError:
    return TraceError(msg, "trace config", field=key)


def _check_common(o: dict) -> None:
    if not isinstance(o["start"], int) or isinstance(o["start"], bool) or o["start"] < 0:
        raise _bad("start", f"must be an integer >= 0, got {o['start']!r}")
    mr = o["max_requests"]
    if mr is not None and (not isinstance(mr, int) or isinstance(mr, bool) or mr < 1):
        raise _bad("max_requests", f"must be null or an integer >= 1, got {mr!r}")
    ts = o["time_scale"]
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not (0 < ts < math.inf):
        raise _bad("time_scale", f"must be a finite number > 0, got {ts!r}")
    if o["overlength"] not in POLICIES:
        raise _bad("overlength", f"must be one of {POLICIES}, got {o['overlength']!r}")
    if o["zero_length"] is None:
        o["zero_length"] = o["overlength"]
    if o["zero_length"] not in POLICIES:
        raise _bad("zero_length", f"must be null or one of {POLICIES}, got {o['zero_length']!r}")
    if not isinstance(o["seed"], int):
        raise _bad("seed", f"must be an integer, got {o['seed']!r}")
    w = o["window"]
    if w is not None:
        ok = isinstance(w, list) and len(w) == 2 and all(
            x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)) for x in w)
        if not ok or (w[0] is not None and w[1] is not None and w[0] >= w[1]):
            raise _bad("window", f"must be [start_s, end_s) with start_s < end_s, got {w!r}")
        o["window"] = [float(w[0] or 0.0), None if w[1] is None else float(w[1])]


def resolve_path(path: Any) -> Path:
    """A path as given, else relative to the project root (Hydra may change the cwd)."""
    if path is None or path == "":
        raise TraceError("no path given for a file-based trace", "trace config", field="path")
    p = Path(str(path)).expanduser()
    if p.exists() or p.is_absolute():
        return p
    alt = PROJECT_ROOT / p
    return alt if alt.exists() else p


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
        raise TraceError(f"prompt {p} + output {o} tokens > max_model_len {max_model_len} "
                         "(overlength=error)", path, row.line, "length")
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


def finalize(rows: Iterable[Row], opts: dict, *, path: Any, vocab_size: int, max_model_len: int,
             report: dict | None = None) -> Trace:
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
        raise TraceError(f"no requests selected ({counts}); check the file, window, start, filters "
                         "and policies", path)
    offset = 0.0
    if opts["rebase"]:
        offset = window[0] if window is not None else kept[0][0].arrival_s
    synth = [j for j, (row, _, _) in enumerate(kept) if row.tokens is None]
    batch = dict(zip(synth, batch_request_tokens(opts["seed"], [kept[j][0].index for j in synth],
                                                   [kept[j][1] for j in synth], vocab_size, low)))
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
        reqs.append(RequestSpec(f"{opts['name']}-{row.index}", (row.arrival_s - offset) / opts["time_scale"],
                                ids, o, ignore_eos=bool(opts["ignore_eos"]), meta=meta))
    rep = {
        "format": opts["name"], "path": None if path is None else str(path),
        "rows_read": stats.pop("rows_read", 0), "requests": len(reqs), "stopped_at": stop,
        "skipped": {k.split(".", 1)[1]: v for k, v in stats.items() if k.startswith("skipped.")},
        "clipped": {k.split(".", 1)[1]: v for k, v in stats.items() if k.startswith("clipped.")},
        "overlength_policy": opts["overlength"], "zero_length_policy": opts["zero_length"],
        "max_model_len": max_model_len, "start": opts["start"], "window": window,
        "max_requests": opts["max_requests"], "time_scale": opts["time_scale"],
        "rebase_offset_s": offset, "duration_s": reqs[-1].arrival_s - reqs[0].arrival_s,
    }
    for k, v in (report or {}).items():  # format-specific counts (filters, invalid entries...)
        if k == "skipped":
            rep["skipped"].update(v)
        else:
            rep[k] = v
    return Trace(reqs, rep)
