"""Trace options: defaults shared by every format, validation, config plumbing, path lookup."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .types import TraceError

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the directory holding experiments/
POLICIES = ("clip", "skip", "error")
COMMON_DEFAULTS: dict[str, Any] = {
    "name": None,
    "start": 0,  # skip this many rows (after the window)
    "window": None,  # [start_s, end_s) on the trace clock; end_s may be null (open)
    "max_requests": None,  # stop after this many requests are kept
    "time_scale": 1.0,  # rate multiplier: arrival times are divided by it
    "seed": 0,  # token ids and any synthesised arrivals/lengths
    "overlength": "clip",  # prompt + output > max_model_len: clip | skip | error
    "zero_length": None,  # 0-token prompt/output: clip (to 1) | skip | error; null = overlength
    "rebase": True,  # shift arrivals so the selection starts at 0 (the window start if any)
    "ignore_eos": True,
    "token_low": 100,  # synthesised ids are drawn from [token_low, vocab_size): no special ids
    "horizon_s": 366 * 86400,  # arrivals later than this after the first are refused as corrupt; null = any
}
INT64_MAX = 2**63 - 1


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
        raise TraceError(f"unknown trace option(s) {unknown}; allowed: {sorted(allowed)}", "trace config")
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
    if not isinstance(o["seed"], int) or isinstance(o["seed"], bool):
        raise _bad("seed", f"must be an integer, got {o['seed']!r}")
    if not isinstance(o["token_low"], int) or isinstance(o["token_low"], bool) or o["token_low"] < 0:
        raise _bad("token_low", f"must be an integer >= 0, got {o['token_low']!r}")
    h = o["horizon_s"]
    if h is not None and (not isinstance(h, (int, float)) or isinstance(h, bool) or not (0 < h < math.inf)):
        raise _bad("horizon_s", f"must be null or a finite number > 0, got {h!r}")
    for key in ("rebase", "ignore_eos"):
        if not isinstance(o[key], bool):
            raise _bad(key, f"must be true or false, got {o[key]!r}")
    w = o["window"]
    if w is not None:
        ok = (
            isinstance(w, list)
            and len(w) == 2
            and all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)) for x in w)
        )
        if not ok or (w[0] is not None and w[1] is not None and w[0] >= w[1]):
            raise _bad("window", f"must be [start_s, end_s) with start_s < end_s, got {w!r}")
        o["window"] = [float(w[0] or 0.0), None if w[1] is None else float(w[1])]


def check_rate(o: dict, key: str) -> None:
    """A synthesised arrival rate o[key] (per second): null (everything at t=0) or a number > 0 (inf: all at
    t=0, as null); the gamma shape `burstiness` a finite number > 0."""
    rate = o[key]
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0):
        raise _bad(key, f"must be null (every arrival at t=0) or a number > 0 per second, got {rate!r}")
    b = o["burstiness"]
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b < math.inf:
        raise _bad("burstiness", f"must be a finite number > 0, got {b!r}")


def resolve_path(path: Any) -> Path:
    """A path as given, else relative to the project root (Hydra may change the cwd)."""
    if path is None or path == "" or path == "???":  # "???": Hydra's unset mandatory value
        raise TraceError("no path given for a file-based trace (set trace.path=...)", "trace config", field="path")
    p = Path(str(path)).expanduser()
    if p.exists() or p.is_absolute():
        return p
    alt = PROJECT_ROOT / p
    return alt if alt.exists() else p
