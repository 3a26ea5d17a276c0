"""POST /v1/chat/completions: messages (and tools) through the model's chat template, the reply whole or
streamed; with tools, the reply's tool calls read as testbed/server/tools/ describes. return_token_ids: the
prompt's token ids (chat template applied) at the top level and each choice's generated ids on it; a
stream sends the prompt's on its first chunk and each chunk's new ids on its choice (vLLM's layout)."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Request

from testbed.outputs import RequestOutput
from testbed.server import protocol as P
from testbed.server.async_engine import AsyncEngine
from testbed.server.logprobs import chat_logprobs, prompt_logprobs_json
from testbed.server.request_input import Admitted, admit_request
from testbed.server.responses import answer, usage_of
from testbed.server.served_model import ServedModel
from testbed.server.text_deltas import text_deltas
from testbed.server.tools.parsers import ToolParser
from testbed.server.tools.render import chat_prompt_ids
from testbed.server.tools.reply import ToolDeltas, ToolReply, tool_reply


def chat_body(model: ServedModel, a: Admitted, out: RequestOutput, reply: ToolReply | None) -> dict:
    choices = []
    for i, c in enumerate(out.outputs):
        lp = None
        if a.req.logprobs:
            lp = chat_logprobs(model.tokenizer, c.token_ids, c.logprobs or [], a.req.top_logprobs or 0)
        if reply is None:
            message, finish = {"role": "assistant", "content": c.text}, c.finish_reason
        else:
            message, finish = reply.message(c.text, c.finish_reason)
        choices.append(P.choice(i, {"message": message}, lp, finish, c.stop_reason))
        if a.req.return_token_ids:
            choices[-1]["token_ids"] = list(c.token_ids)
    body = P.response(a.rid, a.created, model.name, "chat.completion", choices, usage_of(a, out))
    if a.req.return_token_ids:
        body["prompt_token_ids"] = list(a.prompt_ids)
    if a.req.prompt_logprobs is not None and out.prompt_logprobs is not None:  # vLLM: top level
        body["prompt_logprobs"] = prompt_logprobs_json(model.tokenizer, out.prompt_logprobs)
    return body


async def chat_chunks(model: ServedModel, a: Admitted, reply: ToolReply | None):
    req, n_prompt, obj = a.req, len(a.prompt_ids), "chat.completion.chunk"
    tools: dict[int, ToolDeltas] = {}
    # OpenAI's first chunk of each choice carries the role alone
    for i in range(a.params.n):
        role = P.choice(i, {"delta": {"role": "assistant", "content": ""}}, None, None)
        usage = P.usage(n_prompt, 0) if req.continuous_usage else None
        first = P.response(a.rid, a.created, model.name, obj, [role], usage)
        if req.return_token_ids and i == 0:
            first["prompt_token_ids"] = list(a.prompt_ids)
        yield first
    async for d in text_deltas(model.tokenizer, a.params, a.stream):
        out, c = d.out, d.choice
        if c is not None:
            lp = None
            if req.logprobs:
                lp = chat_logprobs(model.tokenizer, d.new_token_ids, d.logprobs, req.top_logprobs or 0)
            u = usage_of(a, out, d.completion_tokens) if req.continuous_usage else None
            finish, stop = (c.finish_reason, c.stop_reason) if d.done else (None, None)
            if reply is None:
                delta = {"content": d.text} if (d.text or not d.done) else {}
            else:
                state = tools.setdefault(c.index, ToolDeltas(reply))
                text = state.add(d.text)
                delta = {"content": text} if text else {}
                if d.done:
                    last, finish = state.finish(c.finish_reason)
                    delta = {**last, "content": text + last["content"]} if "content" in last else {**delta, **last}
                elif not delta and lp is None and not req.return_token_ids:
                    continue  # output held back (a tool call may be starting): no chunk
            chunk = P.choice(c.index, {"delta": delta}, lp, finish, stop)
            if req.return_token_ids:
                chunk["token_ids"] = list(d.new_token_ids)
            yield P.response(a.rid, a.created, model.name, obj, [chunk], u)
        if out.finished and req.include_usage:
            yield P.usage_chunk(a.rid, a.created, model.name, obj, usage_of(a, out))


def chat_routes(model: ServedModel, async_engine: AsyncEngine, parser: ToolParser | None = None) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        prompt_ids = partial(chat_prompt_ids, parser=parser)
        a = await admit_request(request, P.ChatCompletionRequest, prompt_ids, "chatcmpl", model, async_engine)
        reply = tool_reply(a.req, parser)
        chunks, body = (lambda: chat_chunks(model, a, reply)), (lambda out: chat_body(model, a, out, reply))
        return await answer(request, a, chunks, body)

    return router
