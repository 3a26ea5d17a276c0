"""ServerSettings: the `server:` config group (conf/server/default.yaml), checked once at startup."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_waiting: int = 1024  # waiting requests beyond this get 503
    graceful_timeout_s: float = 30.0  # on SIGTERM: wait this long for in-flight requests, then abort them
    served_model_name: str | None = None  # None: the engine's (= the config's) model name
    log_level: str = "info"
    access_log: bool = False

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
        if settings.max_waiting < 1:
            raise ValueError(f"server.max_waiting must be >= 1, got {settings.max_waiting}")
        return settings
