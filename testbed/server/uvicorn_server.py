"""Running the app under uvicorn, with a graceful SIGTERM/SIGINT: stop accepting, let in-flight requests
finish (up to server.graceful_timeout_s), then abort what is left, stop the stepping thread and return."""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import signal
import threading
from typing import Any

import uvicorn

from testbed.server.app import build_app
from testbed.server.async_engine import AsyncEngine
from testbed.server.http_protocol import with_header_timeout
from testbed.server.metrics import ServerMetrics
from testbed.server.settings import ServerSettings

logger = logging.getLogger("testbed.server")


class DrainingServer(uvicorn.Server):
    """uvicorn.Server that stops admitting on the first signal and exits cleanly afterwards
    (uvicorn would re-raise the signal once shut down, killing the process with it)."""

    def __init__(self, config, async_engine: AsyncEngine, graceful_timeout_s: float = 30.0):
        super().__init__(config)
        self.async_engine = async_engine
        self.graceful_timeout_s = graceful_timeout_s

    def handle_exit(self, sig, frame) -> None:
        if not self.async_engine.draining:
            logger.info(
                "signal %s: draining %d in-flight requests (up to %ss)",
                sig,
                self.async_engine.num_in_flight,
                self.graceful_timeout_s,
            )
            self.async_engine.begin_drain()
            # past the grace period, end what is left properly (finish_reason "abort", then [DONE]);
            # uvicorn's own timeout, a little later, is the backstop that cuts connections
            timer = threading.Timer(self.graceful_timeout_s, self.async_engine.abort_all)
            timer.daemon = True
            timer.start()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def make_server(engine, settings: ServerSettings) -> tuple[DrainingServer, AsyncEngine]:
    async_engine = AsyncEngine(
        engine, settings.max_waiting, ServerMetrics(settings.served_model_name or engine.model_name)
    )
    app = build_app(async_engine, settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=int(settings.port),
        log_level=settings.log_level,
        access_log=settings.access_log,
        lifespan="on",
        timeout_keep_alive=30,
        http=with_header_timeout(settings.header_timeout_s),  # h11, plus a timeout on reading request heads
        timeout_graceful_shutdown=math.ceil(settings.graceful_timeout_s) + 5,
    )
    return DrainingServer(config, async_engine, settings.graceful_timeout_s), async_engine


def serve(engine, server_cfg: Any = None, **overrides) -> dict:
    """Serve `engine` until SIGTERM/SIGINT; returns a small summary. Used by `run.py mode=serve`."""
    settings = ServerSettings.from_cfg(server_cfg, **overrides)
    server, async_engine = make_server(engine, settings)
    # the process serves this one engine until it exits: what start-up built (the model, the block pool)
    # leaves the cyclic collector's generations, so its collections while serving do not walk it (vLLM
    # and SGLang freeze after start-up the same way; not in Engine itself, since a process that builds
    # engine after engine would never collect the frozen ones)
    gc.collect()
    gc.freeze()
    logger.info(
        "serving %s on http://%s:%s (api key %s)",
        settings.served_model_name or engine.model_name,
        settings.host,
        settings.port,
        "required" if settings.api_key else "off",
    )
    server.run()
    return {
        "mode": "serve",
        "model": settings.served_model_name or engine.model_name,
        "num_finished": async_engine.num_finished,
        "num_steps": async_engine.num_steps,
    }
