"""Request-body limits, as ASGI middleware in front of the app: a body larger than server.max_body_bytes is
refused with 413 before it is read (at once from its Content-Length, else as soon as the bytes received pass
the limit), and a body that has not fully arrived within server.body_timeout_s gets 408, so a client that
sends half a body cannot hold a connection and a handler for ever. Both answers close the connection."""

from __future__ import annotations

import asyncio

from fastapi.responses import JSONResponse

from testbed.server import protocol as P


def body_too_large(limit: int) -> P.APIError:
    return P.APIError(
        f"the request body is larger than the server's limit of {limit} bytes (server.max_body_bytes)",
        413,
        code="request_too_large",
    )


class BodyLimits:
    def __init__(self, app, max_body_bytes: int, body_timeout_s: float):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return await _answer(scope, receive, send, body_too_large(self.max_body_bytes))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        received, complete = 0, False

        async def limited_receive():
            nonlocal received, complete
            if complete:  # after the body: disconnect notices, which may take as long as the response
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise P.APIError(
                    f"the request body did not arrive within {self.body_timeout_s:g} s (server.body_timeout_s)",
                    408,
                    code="request_timeout",
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise body_too_large(self.max_body_bytes)
                complete = not message.get("more_body", False)
            else:
                complete = True
            return message

        await self.app(scope, limited_receive, send)


async def _answer(scope, receive, send, error: P.APIError) -> None:
    response = JSONResponse(error.body(), status_code=error.status_code, headers={"Connection": "close"})
    await response(scope, receive, send)
