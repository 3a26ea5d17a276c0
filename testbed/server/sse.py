"""Server-sent events in OpenAI's streaming format: `data: <json>` per chunk, then `data: [DONE]`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from testbed.server import protocol as P
from testbed.server.async_engine import EngineError, ShuttingDownError


def sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


async def event_stream(chunks: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    """The chunks as events, then [DONE]; a failure mid-stream (the status line is already sent) is an
    error event instead of the remaining chunks."""
    try:
        async for chunk in chunks:
            yield sse(chunk)
    except (EngineError, ShuttingDownError, ValueError) as e:
        yield sse(P.error_body(str(e), "server_error" if isinstance(e, EngineError) else "invalid_request_error"))
    yield sse("[DONE]")


class SSEResponse(StreamingResponse):
    """A streaming response that runs `on_close` however it ends (done, client gone, cancelled).

    The body generator alone is not enough: if the client leaves before the first chunk, the
    generator never starts and its `finally` never runs."""

    def __init__(self, content, on_close, **kwargs):
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            **kwargs,
        )
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
