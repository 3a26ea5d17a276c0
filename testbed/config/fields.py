"""What the engine's config groups share: the flat keyword a field is also given by (vLLM's EngineArgs
spelling: `kv_cache_memory_gb` for `cache.memory_gb`), and errors renamed to the name the caller used."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

FLAT = "flat"  # field metadata key: the field's flat keyword when it differs from the field's name


def flat(name: str, default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A field whose flat keyword (EngineConfig(**flat), LLM(...)) is `name`."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata={FLAT: name})


def flat_name(f: dataclasses.Field) -> str:
    return f.metadata.get(FLAT, f.name)


_LEADING_FIELD = re.compile(r"\b(\w+)(?::| must\b)")


def renamed(error: Exception, names: dict[str, str]) -> Exception:
    """The error with the field it leads with (`memory_gb must ...`, `block_size: must ...`) named as the
    caller knows it (`kv_cache_memory_gb must ...`, `cache.block_size: must ...`); the error itself when it
    names no field of `names`."""
    message = str(error)
    match = _LEADING_FIELD.search(message)
    if match is None or match.group(1) not in names:
        return error
    name = names[match.group(1)]
    start, end = match.span(1)
    new = type(error)(message[:start] + name + message[end:])
    new.__cause__ = error.__cause__
    return new
