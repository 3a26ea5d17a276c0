"""Answering an admitted request: as server-sent events (stream: true) or, once it has finished, as one
JSON body. A client that leaves early has its request aborted either way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from testbed.outputs import RequestOutput
from testbed.server import protocol as P
from testbed.server.async_engine import EngineError, RequestStream
from testbed.server.request_input import Admitted
from testbed.server.sse import SSEResponse, event_stream


def usage_of(admitted: Admitted, out: RequestOutput, completion_tokens: int | None = None) -> dict:
    """OpenAI's usage of a request as it is now, with the prompt tokens the prefix cache served; completion
    tokens: those of every returned choice (vLLM's count: with best_of, of the n returned), unless given."""
    metrics = out.metrics
    cached = metrics.num_cached_tokens if metrics is not None else 0
    if completion_tokens is None:
        completion_tokens = sum(len(c.token_ids) for c in out.outputs)
    return P.usage(len(admitted.prompt_ids), completion_tokens, cached)


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def final_outputs(streams: list[RequestStream], request: Request):
    """The finished output of each stream, in order, or None if the client went away (all are then
    aborted)."""

    async def drain(stream):
        last = None
        async for out in stream:
            last = out
        return last

    consumer = asyncio.ensure_future(asyncio.gather(*(drain(s) for s in streams)))
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if consumer in done:
            return consumer.result()
        consumer.cancel()
        return None
    finally:
        watcher.cancel()
        for stream in streams:
            stream.abort()


async def final_output(stream: RequestStream, request: Request):
    """The finished output, or None if the client went away (the request is then aborted)."""
    outs = await final_outputs([stream], request)
    return None if outs is None else outs[0]


async def merged(sources: list[AsyncIterator[dict]]) -> AsyncIterator[dict]:
    """The items of several async iterators as they come (one prompt's chunks in order); the first
    failure ends it."""
    if len(sources) == 1:
        async for item in sources[0]:
            yield item
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(source):
        try:
            async for item in source:
                await queue.put(item)
            await queue.put(end)
        except Exception as e:
            await queue.put(e)

    tasks = [asyncio.ensure_future(pump(s)) for s in sources]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()


async def answer(
    request: Request,
    admitted: Admitted,
    chunks: Callable[[], AsyncIterator[dict]],
    body: Callable[[RequestOutput], dict],
):
    """stream: true: the events of chunks(); otherwise body(the finished output) as JSON."""
    if admitted.req.stream:
        return SSEResponse(event_stream(chunks()), admitted.stream.abort)
    try:
        out = await final_output(admitted.stream, request)
    except EngineError as e:  # this request failed (finish_reason "error"); the others are untouched
        return JSONResponse(P.error_body(str(e), "server_error"), status_code=500)
    if out is None:
        return Response(status_code=499)  # the client closed the connection (nginx's code)
    return JSONResponse(body(out))


async def answer_all(
    request: Request,
    batch: list[Admitted],
    chunks: Callable[[], AsyncIterator[dict]],
    body: Callable[[list[RequestOutput]], dict],
):
    """answer() for the engine requests of one call (a completions batch): one stream or one body."""
    if batch[0].req.stream:

        def abort_all():
            for a in batch:
                a.stream.abort()

        return SSEResponse(event_stream(chunks()), abort_all)
    try:
        outs = await final_outputs([a.stream for a in batch], request)
    except EngineError as e:
        return JSONResponse(P.error_body(str(e), "server_error"), status_code=500)
    if outs is None:
        return Response(status_code=499)
    return JSONResponse(body(outs))
