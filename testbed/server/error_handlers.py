"""Every error as an OpenAI-style body: our APIErrors, FastAPI's own (404, 405, validation) and crashes."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from testbed.server import protocol as P

logger = logging.getLogger("testbed.server")


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(P.APIError)
    async def _api_error(request, exc: P.APIError):
        headers = {"Retry-After": "1"} if exc.status_code == 503 else None
        if exc.status_code in (408, 413):  # the rest of the body may still be on its way: drop the connection
            headers = {"Connection": "close"}
        return JSONResponse(exc.body(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        message = {
            404: f"no route {request.method} {request.url.path}",
            405: f"method {request.method} not allowed on {request.url.path}",
        }.get(exc.status_code, str(exc.detail))
        return JSONResponse(
            P.error_body(message, "invalid_request_error", code=str(exc.status_code)),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc: RequestValidationError):
        return JSONResponse(P.error_body(str(exc), "invalid_request_error"), status_code=400)

    @app.exception_handler(Exception)
    async def _internal_error(request, exc: Exception):
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(P.error_body(f"internal error: {exc!r}", "server_error"), status_code=500)
