"""Running the HTTP router under uvicorn: `serve_router` (run.py mode=route), `RouterThread` (tests)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import cast

import uvicorn
from fastapi import FastAPI

from testbed.cluster.config import ClusterConfig
from testbed.cluster.http.app import build_router_app
from testbed.cluster.http.backends import BackendPool
from testbed.cluster.http.metrics import RouterMetrics
from testbed.cluster.routers import get_router
from testbed.server.http_protocol import with_header_timeout
from testbed.server.settings import ServerSettings

logger = logging.getLogger("testbed.router")


def make_router_server(cluster_cfg, server_cfg=None, **server_overrides) -> uvicorn.Server:
    cluster = ClusterConfig.from_any(cluster_cfg)
    if not cluster.backends:
        raise ValueError("mode=route needs backends: cluster.backends=[http://host1:8000,http://host2:8000]")
    settings = ServerSettings.from_cfg(server_cfg, **server_overrides)
    metrics = RouterMetrics(label_by_url=cluster.metrics_backend_urls)
    pool = BackendPool(
        list(cluster.backends), cluster.unhealthy_after, cluster.probe_timeout_s, metrics, cluster.failure_window_s
    )
    router = get_router(cluster.router, **cluster.router_options)
    app = build_router_app(
        pool, router, metrics, cluster.probe_interval_s, cluster.request_timeout_s, settings, cluster.stall_timeout_s
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=int(settings.port),
        log_level=settings.log_level,
        access_log=settings.access_log,
        http=with_header_timeout(settings.header_timeout_s),  # h11, plus a timeout on reading request heads
    )
    return uvicorn.Server(config)


def _pool(server: uvicorn.Server) -> BackendPool:
    """The backends of a server make_router_server built (its app is the router's FastAPI app)."""
    return cast(FastAPI, server.config.app).state.pool


def serve_router(cluster_cfg, server_cfg=None) -> dict:
    """Serve until SIGINT/SIGTERM on server.host:server.port."""
    server = make_router_server(cluster_cfg, server_cfg)
    pool = _pool(server)
    logger.warning(
        "routing %s on http://%s:%s over %s",
        ClusterConfig.from_any(cluster_cfg).router,
        server.config.host,
        server.config.port,
        ", ".join(b.url for b in pool.backends),
    )
    server.run()
    return {"mode": "route", "backends": [b.url for b in pool.backends]}


class RouterThread:
    """The router on a free loopback port in a background thread: `with RouterThread(cluster_cfg) as r: r.url`."""

    def __init__(self, cluster_cfg, host: str = "127.0.0.1", **server_overrides):
        server_overrides.setdefault("log_level", "warning")
        self.server = make_router_server(cluster_cfg, None, host=host, port=0, **server_overrides)
        self.pool = _pool(self.server)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self.url = f"http://{host}:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> RouterThread:
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the router did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(30)
        self._sock.close()
