"""Request and trace result types shared by every trace loader."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


class TraceError(ValueError):
    """Bad trace input; the message names the file, the line (or entry) and the field."""

    def __init__(self, msg: str, path: Any = None, line: Any = None, field: str | None = None):
        self.path, self.line, self.field, self.reason = path, line, field, msg
        where = []
        if path is not None:
            where.append(str(path))
        if line is not None:
            where.append(f"line {line}" if isinstance(line, int) else str(line))
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"{': '.join(where)}: {msg}" if where else msg)


@dataclass
class RequestSpec:
    """One request to replay: the engine gets token ids directly (no text)."""

    request_id: str
    arrival_s: float
    prompt_token_ids: list[int]
    max_tokens: int
    ignore_eos: bool = True  # traces fix the output length, so EOS must not end it early
    priority: int = 0
    meta: dict = field(default_factory=dict)  # original lengths, hash ids, source line, ...

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class Trace:
    """Requests sorted by arrival, plus a report of what was read, skipped and clipped."""

    requests: list[RequestSpec]
    report: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[RequestSpec]:
        return iter(self.requests)

    def __getitem__(self, i):
        return self.requests[i]
