"""OpenAI-compatible HTTP serving of an Engine: `python run.py mode=serve` or `testbed-serve`.

from testbed.server import serve, ServerThread

The names are imported on first use (PEP 562): the config schema reads testbed.server.settings in every
run.py, and only a serving run needs fastapi and uvicorn loaded.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from testbed.server.app import build_app
    from testbed.server.async_engine import AsyncEngine, QueueFullError, ShuttingDownError
    from testbed.server.server_thread import ServerThread
    from testbed.server.settings import ServerSettings
    from testbed.server.uvicorn_server import serve

_WHERE = {
    "AsyncEngine": "async_engine",
    "QueueFullError": "async_engine",
    "ServerSettings": "settings",
    "ServerThread": "server_thread",
    "ShuttingDownError": "async_engine",
    "build_app": "app",
    "serve": "uvicorn_server",
}

__all__ = ["AsyncEngine", "QueueFullError", "ServerSettings", "ServerThread", "ShuttingDownError", "build_app", "serve"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
