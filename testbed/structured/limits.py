"""Bounds on structured-output constraints: the `structured_outputs:` config block (conf/config.yaml).

A constraint's compile time grows with its size (a choice of 30,000 items took 39 s on a CPU core), and
every compiled grammar holds memory, so each is bounded: the constraint's text by `max_grammar_bytes`
(refused before compiling), its compile by `compile_timeout_s` (refused when it runs longer; the compile
itself runs on in its worker thread, which xgrammar cannot interrupt, and its slot stays taken until it
ends), the compiles running at once by `compile_threads`, and the compiled grammars kept for reuse by
`cache_bytes` (xgrammar's GrammarCompiler cache_limit_bytes, least recently used evicted first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class StructuredOutputsConfig:
    max_grammar_bytes: int = 32 * 1024  # a constraint's text (regex, grammar, schema JSON, choices) beyond: 400
    compile_timeout_s: float = 10.0  # a compile (with its wait for a worker) running longer: 400
    compile_threads: int = 2  # compiles running at once, each on one thread, off the engine and event loop
    cache_bytes: int = 256 * 2**20  # compiled grammars kept for reuse (LRU by their memory size)
    max_schema_depth: int = 64  # JSON-schema nesting (objects and arrays) beyond: 400

    def __post_init__(self):
        for name in ("max_grammar_bytes", "compile_threads", "cache_bytes", "max_schema_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"structured_outputs.{name} must be an integer >= 1, got {value!r}")
        t = self.compile_timeout_s
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 < t < math.inf:
            raise ValueError(f"structured_outputs.compile_timeout_s must be a finite number > 0, got {t!r}")

    @classmethod
    def from_any(cls, value: Any = None) -> StructuredOutputsConfig:
        """From None (defaults), an instance, or a mapping whose unknown keys are refused by name."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        values = dict(value)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown structured_outputs settings {unknown}; known: {sorted(names)}")
        return cls(**values)
