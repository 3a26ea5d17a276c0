"""GET /v1/models and /v1/models/{id} (behind the API key), /health and /metrics (open, for probes and
Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from testbed.server import protocol as P
from testbed.server.async_engine import AsyncEngine
from testbed.server.served_model import ServedModel


def model_routes(model: ServedModel) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models():
        return model.model_list()

    @router.get("/v1/models/{model_id:path}")
    async def model_card(model_id: str):
        if model_id != model.name:
            raise P.APIError(f"The model `{model_id}` does not exist.", 404, param="model", code="model_not_found")
        return model.model_list()["data"][0]

    return router


def health_routes(async_engine: AsyncEngine) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health():
        if not async_engine.is_alive:
            return JSONResponse(P.error_body("the engine is not running", "server_error"), status_code=503)
        return {"status": "draining" if async_engine.draining else "ok", "in_flight": async_engine.num_in_flight}

    @router.get("/metrics")
    async def metrics():
        body, content_type = async_engine.metrics.render()
        return Response(body, media_type=content_type)

    return router
