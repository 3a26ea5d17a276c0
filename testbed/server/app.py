"""The FastAPI app: OpenAI-compatible routes over one AsyncEngine.

Routes: POST /v1/completions, POST /v1/chat/completions (stream: true -> server-sent events in
OpenAI's chunk format, ending with `data: [DONE]`), GET /v1/models, POST /tokenize and /detokenize (vLLM's),
GET /version, GET /health, GET /metrics.
Bad input is an OpenAI-style error body: 400 (404 for an unknown route or model, 401 without the
API key, 413 for a body over server.max_body_bytes, 408 for a body that does not arrive within
server.body_timeout_s, 503 when the waiting queue is full or the server is draining).
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from testbed.server.async_engine import AsyncEngine
from testbed.server.auth import api_key_check
from testbed.server.body_limits import BodyLimits
from testbed.server.chat import chat_routes
from testbed.server.completions import completion_routes
from testbed.server.error_handlers import add_error_handlers
from testbed.server.info_routes import health_routes, model_routes
from testbed.server.served_model import ServedModel
from testbed.server.settings import ServerSettings
from testbed.server.tokenize_routes import tokenize_routes, version_routes
from testbed.server.tools.parsers import tool_parser


def build_app(async_engine: AsyncEngine, settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    model = ServedModel(
        async_engine.engine,
        settings.served_model_name,
        settings.max_prompt_chars,
        settings.tokenizer_threads,
        settings.json_max_whitespace,
    )

    @asynccontextmanager
    async def lifespan(app):
        async_engine.start()
        try:
            yield
        finally:
            async_engine.shutdown()
            model.tokenizers.shutdown()

    app = FastAPI(title="testbed", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.model = model
    app.state.async_engine = async_engine
    add_error_handlers(app)
    auth = [Depends(api_key_check(settings.api_key))]
    app.include_router(completion_routes(model, async_engine), dependencies=auth)
    parser = tool_parser(settings.tool_parser)
    app.include_router(chat_routes(model, async_engine, parser), dependencies=auth)
    app.include_router(model_routes(model), dependencies=auth)
    app.include_router(tokenize_routes(model, parser), dependencies=auth)
    app.include_router(version_routes())
    app.include_router(health_routes(async_engine))  # open: load balancers and Prometheus have no key
    app.add_middleware(BodyLimits, max_body_bytes=settings.max_body_bytes, body_timeout_s=settings.body_timeout_s)
    return app
