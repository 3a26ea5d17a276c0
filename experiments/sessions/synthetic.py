"""Synthetic sessions (`trace=sessions`): seeded multi-turn conversations of random token ids.

Each count option is an integer (fixed) or [low, high] (uniform integers, both ends included):
`turns` per session, `first_tokens` (the first user message), `new_tokens` (each later message),
`output_tokens` (every answer). `system_tokens` leading tokens are the same in every session (a shared
system prompt). Think time between a turn's finish and the next turn: `think_s` seconds, exponential with
that mean or fixed (`think_dist`). Sessions start at `session_rate` per second (gamma gaps of shape
`burstiness`; null: all at 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from experiments.traces.config import check_rate, plain
from experiments.traces.counter_rng import arrival_times
from experiments.traces.types import TraceError

from .types import Session, Turn

DEFAULTS: dict[str, Any] = {
    "name": "sessions",
    "num_sessions": 16,
    "turns": [2, 6],
    "system_tokens": 0,
    "first_tokens": [64, 256],
    "new_tokens": [16, 64],
    "output_tokens": [16, 64],
    "think_s": 1.0,
    "think_dist": "exponential",
    "session_rate": None,
    "burstiness": 1.0,
    "seed": 0,
    "token_low": 100,
}
THINK_DISTS = ("exponential", "fixed")


def _bad(key: str, msg: str) -> TraceError:
    return TraceError(msg, "trace config", field=key)


def session_options(cfg: Any, defaults: dict) -> dict:
    """defaults merged with cfg; an unknown key is refused (a typo must not be silently ignored)."""
    cfg = plain(cfg) or {}
    unknown = sorted(set(cfg) - set(defaults))
    if unknown:
        raise TraceError(f"unknown trace option(s) {unknown}; allowed: {sorted(defaults)}", "trace config")
    return {**defaults, **cfg}


def int_range(value: Any, key: str, minimum: int) -> tuple[int, int]:
    """An integer or [low, high] as (low, high), both >= minimum."""
    lo_hi = value if isinstance(value, (list, tuple)) else [value, value]
    if len(lo_hi) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in lo_hi):
        raise _bad(key, f"must be an integer or [low, high], got {value!r}")
    lo, hi = lo_hi
    if lo < minimum or hi < lo:
        raise _bad(key, f"needs {minimum} <= low <= high, got {value!r}")
    return lo, hi


def think_times(rng: np.random.Generator, n: int, mean: Any, dist: Any) -> np.ndarray:
    if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not mean >= 0 or not np.isfinite(mean):
        raise _bad("think_s", f"must be a number >= 0, got {mean!r}")
    if dist not in THINK_DISTS:
        raise _bad("think_dist", f"must be one of {list(THINK_DISTS)}, got {dist!r}")
    if dist == "fixed" or mean == 0:
        return np.full(n, float(mean))
    return rng.exponential(float(mean), size=n)


def check(o: dict) -> None:
    """What can be checked before the run (experiments.run.settings): counts, ranges, rate, think time."""
    n = o["num_sessions"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise _bad("num_sessions", f"must be an integer >= 1, got {n!r}")
    for key, minimum in (("turns", 1), ("first_tokens", 1), ("new_tokens", 1), ("output_tokens", 1)):
        int_range(o[key], key, minimum)
    int_range(o["system_tokens"], "system_tokens", 0)
    check_rate(o, "session_rate")
    think_times(np.random.default_rng(0), 1, o["think_s"], o["think_dist"])


def load(cfg: Any, vocab_size: int, max_model_len: int, tokenizer=None) -> list[Session]:
    o = session_options(cfg, DEFAULTS)
    check(o)
    n = o["num_sessions"]
    turns = int_range(o["turns"], "turns", 1)
    first = int_range(o["first_tokens"], "first_tokens", 1)
    new = int_range(o["new_tokens"], "new_tokens", 1)
    out = int_range(o["output_tokens"], "output_tokens", 1)
    system = int_range(o["system_tokens"], "system_tokens", 0)[0]
    low = o["token_low"]
    if isinstance(low, bool) or not isinstance(low, int) or not 0 <= low < vocab_size:
        raise _bad("token_low", f"must be an integer in [0, vocab size {vocab_size}), got {low!r}")
    rng = np.random.default_rng(o["seed"])
    starts = arrival_times(rng, n, o["session_rate"], float(o["burstiness"]))
    shared = rng.integers(low, vocab_size, size=system).tolist()
    sessions = []
    for i in range(n):
        k = int(rng.integers(turns[0], turns[1] + 1))
        thinks = think_times(rng, k, o["think_s"], o["think_dist"])
        session_turns = []
        for j in range(k):
            lo, hi = first if j == 0 else new
            msg = rng.integers(low, vocab_size, size=int(rng.integers(lo, hi + 1))).tolist()
            session_turns.append(
                Turn(
                    new_token_ids=(shared + msg) if j == 0 else msg,
                    max_tokens=int(rng.integers(out[0], out[1] + 1)),
                    think_s=0.0 if j == 0 else float(thinks[j]),
                )
            )
        sessions.append(Session(f"s{i}", float(starts[i]), session_turns, {"index": i}))
    return sessions
