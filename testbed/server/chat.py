"""POST /v1/chat/completions: messages through the model's chat template, the reply whole or streamed."""

from __future__ import annotations

from fastapi import APIRouter, Request

from testbed.outputs import RequestOutput
from testbed.server import protocol as P
from testbed.server.async_engine import AsyncEngine
from testbed.server.logprobs import chat_logprobs, prompt_logprobs_json
from testbed.server.request_input import Admitted, admit_request, chat_prompt_ids
from testbed.server.responses import answer, usage_of
from testbed.server.served_model import ServedModel
from testbed.server.text_deltas import text_deltas


def chat_body(model: ServedModel, a: Admitted, out: RequestOutput) -> dict:
    c = out.outputs[0]
    lp = (
        chat_logprobs(model.tokenizer, c.token_ids, c.logprobs or [], a.req.top_logprobs or 0)
        if a.req.logprobs
        else None
    )
    body = P.chat_response(
        a.rid,
        a.created,
        model.name,
        c.text,
        c.finish_reason,
        lp,
        usage_of(a, out),
        c.stop_reason,
    )
    if a.req.prompt_logprobs is not None and out.prompt_logprobs is not None:  # vLLM: top level
        body["prompt_logprobs"] = prompt_logprobs_json(model.tokenizer, out.prompt_logprobs)
    return body


async def chat_chunks(model: ServedModel, a: Admitted):
    req, n_prompt = a.req, len(a.prompt_ids)
    # OpenAI's first chunk carries the role alone
    yield P.chat_chunk(
        a.rid,
        a.created,
        model.name,
        {"role": "assistant", "content": ""},
        None,
        usage_=P.usage(n_prompt, 0) if req.continuous_usage else None,
    )
    async for out, text, new, lps in text_deltas(model.tokenizer, a.params, a.stream):
        c = out.outputs[0]
        lp = chat_logprobs(model.tokenizer, new, lps, req.top_logprobs or 0) if req.logprobs else None
        u = usage_of(a, out) if req.continuous_usage else None
        delta = {"content": text} if (text or not out.finished) else {}
        yield P.chat_chunk(
            a.rid,
            a.created,
            model.name,
            delta,
            c.finish_reason if out.finished else None,
            lp,
            u,
            c.stop_reason if out.finished else None,
        )
        if out.finished and req.include_usage:
            yield P.usage_chunk(a.rid, a.created, model.name, "chat.completion.chunk", usage_of(a, out))


def chat_routes(model: ServedModel, async_engine: AsyncEngine) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        a = await admit_request(request, P.ChatCompletionRequest, chat_prompt_ids, "chatcmpl", model, async_engine)
        return await answer(request, a, lambda: chat_chunks(model, a), lambda out: chat_body(model, a, out))

    return router
