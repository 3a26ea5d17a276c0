"""Trace loaders for the `trace=` Hydra config group.

    trace = load_trace(cfg.trace, vocab_size=..., max_model_len=..., tokenizer=tok)
    for req in trace: ...            # RequestSpec, sorted by arrival_s
    trace.report                     # rows read, skipped / clipped counts, policy applied

Formats: azure, mooncake, burstgpt, sharegpt (needs tokenizer), synthetic. Options shared by
all are documented in common.COMMON_DEFAULTS; each module documents its own.
"""

from __future__ import annotations

import numbers
from typing import Any

from . import azure, burstgpt, mooncake, sharegpt, synthetic
from .common import COMMON_DEFAULTS, PROJECT_ROOT, plain, resolve_path
from .types import RequestSpec, Trace, TraceError

LOADERS = {
    "azure": azure.load,
    "mooncake": mooncake.load,
    "burstgpt": burstgpt.load,
    "sharegpt": sharegpt.load,
    "synthetic": synthetic.load,
}


def load_trace(cfg: Any, vocab_size: int, max_model_len: int, tokenizer=None) -> Trace:
    """Load the trace described by cfg (dict or DictConfig) and dispatch on cfg["name"].

    vocab_size bounds synthesised token ids (use the tokenizer's regular vocabulary size so no
    added/special id is drawn); max_model_len bounds prompt + output (see the overlength option).
    """
    cfg = plain(cfg)
    if not isinstance(cfg, dict):
        raise TraceError(f"trace config must be a mapping, got {type(cfg).__name__}", "trace config")
    name = cfg.get("name")
    if name not in LOADERS:
        raise TraceError(f"unknown trace format {name!r}; one of {sorted(LOADERS)}", "trace config", field="name")
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (vocab_size, max_model_len)):
        raise TraceError(
            f"vocab_size and max_model_len must be integers, got {vocab_size!r}, {max_model_len!r}",
            "trace config",
        )
    return LOADERS[name](cfg, vocab_size=int(vocab_size), max_model_len=int(max_model_len), tokenizer=tokenizer)


__all__ = [
    "load_trace",
    "RequestSpec",
    "Trace",
    "TraceError",
    "LOADERS",
    "COMMON_DEFAULTS",
    "PROJECT_ROOT",
    "resolve_path",
]
