"""An in-process server on a free loopback port, in a background thread (tests, notebooks)."""

from __future__ import annotations

import signal
import socket
import threading
import time

from testbed.server.settings import ServerSettings
from testbed.server.uvicorn_server import make_server


class ServerThread:
    """Starts on entering, stops on leaving as SIGTERM would:

    with ServerThread(engine, api_key="k") as srv:
        openai.OpenAI(base_url=srv.url + "/v1", api_key="k")...
    """

    def __init__(self, engine, host: str = "127.0.0.1", port: int = 0, **settings):
        settings.setdefault("log_level", "warning")
        self.settings = ServerSettings.from_cfg(None, host=host, port=port, **settings)
        self.server, self.async_engine = make_server(engine, self.settings)
        self.engine = engine
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, name="uvicorn", daemon=True
        )

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float | None = None) -> None:
        """What SIGTERM does: refuse new requests, let in-flight ones finish for graceful_timeout_s, then
        abort them; returns once the server has shut down."""
        if self._thread.is_alive():
            self.server.handle_exit(signal.SIGTERM, None)
            self._thread.join(timeout if timeout is not None else self.settings.graceful_timeout_s + 30)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
