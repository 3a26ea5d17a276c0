"""Multi-turn session workloads (`replay=sessions` with trace=sessions|sharegpt_sessions|mooncake_sessions)."""

from __future__ import annotations

from typing import Any

from experiments.traces.config import plain
from experiments.traces.types import TraceError

from . import mooncake, sharegpt, synthetic
from .types import Session, Turn, session_report

SOURCES = {
    "sessions": synthetic.load,
    "sharegpt_sessions": sharegpt.load,
    "mooncake_sessions": mooncake.load,
}


def is_session_trace(trace_cfg: Any) -> bool:
    cfg = plain(trace_cfg)
    return isinstance(cfg, dict) and cfg.get("name") in SOURCES


def load_sessions(trace_cfg: Any, vocab_size: int, max_model_len: int, tokenizer=None) -> list[Session]:
    cfg = plain(trace_cfg)
    name = cfg.get("name") if isinstance(cfg, dict) else None
    if name not in SOURCES:
        raise TraceError(
            f"replay=sessions needs a session source, trace={name!r}; one of {sorted(SOURCES)}",
            "trace config",
            field="name",
        )
    return SOURCES[name](cfg, vocab_size=vocab_size, max_model_len=max_model_len, tokenizer=tokenizer)


__all__ = ["SOURCES", "Session", "Turn", "is_session_trace", "load_sessions", "session_report"]
