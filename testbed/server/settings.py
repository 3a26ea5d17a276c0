"""ServerSettings: the `server:` config group (conf/server/default.yaml), checked once at startup."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from testbed.server.tools.parsers import tool_parser
from testbed.structured.params import JSON_MAX_WHITESPACE


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_waiting: int = 1024  # waiting requests beyond this get 503
    graceful_timeout_s: int | float = 30.0  # on SIGTERM: wait this long for in-flight requests, then abort them
    served_model_name: str | None = None  # None: the engine's (= the config's) model name
    log_level: str = "info"
    access_log: bool = False
    max_body_bytes: int = 4 * 2**20  # larger request bodies get 413 before they are read
    max_prompt_chars: int = 1_000_000  # longer text prompts (chat: all messages) get 400 before tokenizing
    header_timeout_s: int | float = 20.0  # a connection that has not sent a whole request head by then is closed
    body_timeout_s: int | float = 60.0  # a request whose body has not fully arrived by then gets 408
    tokenizer_threads: int = 2  # tokenization and chat templates run here, off the event loop
    tool_parser: str | None = "hermes"  # reads tool calls (tool_choice auto); None: auto is refused
    json_max_whitespace: int | None = JSON_MAX_WHITESPACE  # longest whitespace run in constrained JSON

    @classmethod
    def from_cfg(cls, cfg: Any = None, **overrides) -> ServerSettings:
        values = {}
        if cfg is not None:
            try:
                from omegaconf import DictConfig, OmegaConf

                if isinstance(cfg, DictConfig):
                    cfg = OmegaConf.to_container(cfg, resolve=True)
            except ImportError:  # pragma: no cover
                pass
            values.update(dict(cfg))
        values.update(overrides)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown server settings {unknown}; known: {sorted(names)}")
        settings = cls(**values)
        if settings.api_key == "":
            settings.api_key = None
        if not 0 <= int(settings.port) <= 65535:
            raise ValueError(f"server.port must be in [0, 65535], got {settings.port}")
        for name in ("max_waiting", "max_body_bytes", "max_prompt_chars", "tokenizer_threads"):
            value = getattr(settings, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"server.{name} must be an integer >= 1, got {value!r}")
        tool_parser(settings.tool_parser)  # a name it does not know: ValueError naming the known ones
        ws = settings.json_max_whitespace
        if ws is not None and (not isinstance(ws, int) or isinstance(ws, bool) or ws < 1):
            raise ValueError(f"server.json_max_whitespace must be an integer >= 1 or null, got {ws!r}")
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(settings, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise ValueError(f"server.{name} must be a finite number > 0, got {value!r}")
        return settings
