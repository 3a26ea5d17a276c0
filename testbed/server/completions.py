"""POST /v1/completions: one prompt (text or token ids) in, its completion out, whole or streamed."""

from __future__ import annotations

from fastapi import APIRouter, Request

from testbed.outputs import CompletionOutput
from testbed.server import protocol as P
from testbed.server.async_engine import AsyncEngine
from testbed.server.logprobs import completion_logprobs
from testbed.server.request_input import Admitted, admit_request, completion_prompt_ids
from testbed.server.responses import answer
from testbed.server.served_model import ServedModel
from testbed.server.text_deltas import text_deltas


def completion_body(model: ServedModel, a: Admitted, c: CompletionOutput) -> dict:
    lp = (
        completion_logprobs(model.tokenizer, c.token_ids, c.logprobs or [], 0)
        if a.params.logprobs is not None
        else None
    )
    return P.completion_response(
        a.rid,
        a.created,
        model.name,
        c.text,
        c.finish_reason,
        lp,
        P.usage(len(a.prompt_ids), len(c.token_ids)),
        c.stop_reason,
    )


async def completion_chunks(model: ServedModel, a: Admitted):
    req, n_prompt, text_pos = a.req, len(a.prompt_ids), 0
    async for out, text, new, lps in text_deltas(model.tokenizer, a.params, a.stream):
        c = out.outputs[0]
        lp = None
        if a.params.logprobs is not None:
            lp = completion_logprobs(model.tokenizer, new, lps, text_pos)
        text_pos += len(text)
        u = P.usage(n_prompt, len(c.token_ids)) if req.continuous_usage else None
        yield P.completion_chunk(
            a.rid,
            a.created,
            model.name,
            text,
            c.finish_reason if out.finished else None,
            lp,
            u,
            c.stop_reason if out.finished else None,
        )
        if out.finished and req.include_usage:
            yield P.usage_chunk(a.rid, a.created, model.name, "text_completion", P.usage(n_prompt, len(c.token_ids)))


def completion_routes(model: ServedModel, async_engine: AsyncEngine) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/completions")
    async def completions(request: Request):
        a = await admit_request(request, P.CompletionRequest, completion_prompt_ids, "cmpl", model, async_engine)
        return await answer(request, a, lambda: completion_chunks(model, a), lambda c: completion_body(model, a, c))

    return router
