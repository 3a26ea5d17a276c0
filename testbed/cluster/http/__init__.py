"""The HTTP router (`python run.py mode=route cluster.backends=[...]`): an OpenAI-compatible front end over
testbed-serve backends, with health probes and its own /metrics."""

from testbed.cluster.http.serve import RouterThread, make_router_server, serve_router

__all__ = ["RouterThread", "make_router_server", "serve_router"]
