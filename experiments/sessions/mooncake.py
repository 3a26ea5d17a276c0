"""Mooncake requests grouped into sessions (`trace=mooncake_sessions`).

The Mooncake traces give each request the hash ids of its prompt blocks, not a session id. A request
continues the session whose latest turn's hash ids, all but the last, lead its own (that last block may be
partly filled, and a next turn's tokens would continue it), when it has tokens past them; the longest
such prefix wins, and a turn is continued once (later requests with the same history start sessions of
their own, which still share its blocks). Everything else starts a session.

Replayed, turn k+1's prompt is turn k's whole prompt + the engine's answer + the request's own tokens
after the shared blocks, so it is longer than the recorded prompt by turn k's last block and answer (the
trace does not say where the recorded answer sits). Its think time is the trace gap between the two
requests divided by trace.time_scale (a deviation: that gap also holds the recorded service time). Token ids
are those of trace=mooncake (equal hash ids, equal blocks), so sessions share blocks with each other as
the trace's requests do.
"""

from __future__ import annotations

from typing import Any

from experiments.traces import load_trace
from experiments.traces.config import plain
from experiments.traces.types import TraceError

from .types import Session, Turn


def group(specs, block_size: int) -> list[Session]:
    """Sessions from Mooncake RequestSpecs (sorted by arrival, meta["hash_ids"]); block_size: tokens per id."""
    latest: dict[tuple, int] = {}  # a session's latest turn's hash ids but the last -> session index
    sessions: list[Session] = []
    last_spec: list = []  # per session: its latest turn's spec
    for spec in specs:
        ids = tuple(spec.meta.get("hash_ids") or ())
        owner, shared = None, 0
        for k in range(len(ids), 0, -1):  # longest prefix first
            owner = latest.get(ids[:k])
            if owner is not None and len(spec.prompt_token_ids) > k * block_size:
                del latest[ids[:k]]
                shared = k
                break
            owner = None
        if owner is None:
            meta = {"line": spec.meta.get("line"), "request_ids": [spec.request_id]}
            first = Turn(list(spec.prompt_token_ids), spec.max_tokens)
            sessions.append(Session(f"m{len(sessions)}", spec.arrival_s, [first], meta))
            last_spec.append(spec)
            owner = len(sessions) - 1
        else:
            prev = last_spec[owner]
            new = list(spec.prompt_token_ids[shared * block_size :])
            sessions[owner].turns.append(Turn(new, spec.max_tokens, max(0.0, spec.arrival_s - prev.arrival_s)))
            sessions[owner].meta["request_ids"].append(spec.request_id)
            last_spec[owner] = spec
        if len(ids) > 1:
            latest[ids[:-1]] = owner
    return sessions


def load(cfg: Any, vocab_size: int, max_model_len: int, tokenizer=None) -> list[Session]:
    cfg = plain(cfg) or {}
    if not isinstance(cfg, dict):
        raise TraceError("trace config must be a mapping", "trace config")
    trace = load_trace({**cfg, "name": "mooncake"}, vocab_size=vocab_size, max_model_len=max_model_len)
    return group(trace.requests, trace.report["block_size"])
