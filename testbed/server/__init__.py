"""OpenAI-compatible HTTP serving of an Engine: `python run.py mode=serve` or `testbed-serve`.

from testbed.server import serve, ServerThread
"""

from testbed.server.app import build_app
from testbed.server.async_engine import AsyncEngine, QueueFullError, ShuttingDownError
from testbed.server.server_thread import ServerThread
from testbed.server.settings import ServerSettings
from testbed.server.uvicorn_server import serve

__all__ = ["AsyncEngine", "QueueFullError", "ServerSettings", "ServerThread", "ShuttingDownError", "build_app", "serve"]
