"""OpenAI-compatible HTTP serving of an Engine: `python run.py mode=serve` or `testbed-serve`.

    from testbed.server import serve, ServerThread
"""
from testbed.server.app import ServerSettings, ServerThread, build_app, cli, serve
from testbed.server.async_engine import AsyncEngine, QueueFullError, ShuttingDownError

__all__ = ["AsyncEngine", "QueueFullError", "ServerSettings", "ServerThread", "ShuttingDownError", "build_app",
           "cli", "serve"]
