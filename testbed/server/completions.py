"""POST /v1/completions: one prompt (text or token ids) in, its completion out, whole or streamed.
echo: true puts the prompt before the completion (and, with logprobs, the prompt tokens' logprobs first)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from testbed.outputs import RequestOutput
from testbed.server import protocol as P
from testbed.server.async_engine import AsyncEngine
from testbed.server.logprobs import completion_logprobs, prompt_logprobs_json
from testbed.server.request_input import Admitted, admit_request, completion_prompt_ids
from testbed.server.responses import answer, usage_of
from testbed.server.served_model import ServedModel
from testbed.server.text_deltas import text_deltas


def echoed_prompt(model: ServedModel, a: Admitted) -> str:
    prompt = a.req.single_prompt()
    if isinstance(prompt, str):
        return prompt
    return model.tokenizer.decode(a.prompt_ids) if model.tokenizer is not None else ""


def completion_body(model: ServedModel, a: Admitted, out: RequestOutput) -> dict:
    """The whole response: one choice per returned completion (n, or the best n of best_of), indexed in
    order as vLLM's server does."""
    choices = []
    for i, c in enumerate(out.outputs):
        text, token_ids, entries = c.text, c.token_ids, c.logprobs or []
        if a.req.echo:
            text = echoed_prompt(model, a) + text
            if out.prompt_logprobs is not None:
                token_ids, entries = a.prompt_ids + token_ids, out.prompt_logprobs + entries
        lp = completion_logprobs(model.tokenizer, token_ids, entries, 0) if a.params.logprobs is not None else None
        choice = P.choice(i, {"text": text}, lp, c.finish_reason, c.stop_reason)
        if a.req.prompt_logprobs is not None and out.prompt_logprobs is not None:  # vLLM: on the choice
            choice["prompt_logprobs"] = prompt_logprobs_json(model.tokenizer, out.prompt_logprobs)
        choices.append(choice)
    return P.response(a.rid, a.created, model.name, "text_completion", choices, usage_of(a, out))


async def completion_chunks(model: ServedModel, a: Admitted):
    """One chunk per engine output that adds to a choice (with that choice's index)."""
    req, text_pos, echoed = a.req, {}, set()
    async for d in text_deltas(model.tokenizer, a.params, a.stream):
        out, c = d.out, d.choice
        if c is not None:
            text, new, lps = d.text, d.new_token_ids, d.logprobs
            if req.echo and c.index not in echoed:  # the prompt rides on each choice's first chunk
                echoed.add(c.index)
                text = echoed_prompt(model, a) + text
                if out.prompt_logprobs is not None:
                    new, lps = a.prompt_ids + list(new), out.prompt_logprobs + list(lps)
            lp = None
            if a.params.logprobs is not None:
                lp = completion_logprobs(model.tokenizer, new, lps, text_pos.get(c.index, 0))
            text_pos[c.index] = text_pos.get(c.index, 0) + len(text)
            finish, stop = (c.finish_reason, c.stop_reason) if d.done else (None, None)
            usage = usage_of(a, out, d.completion_tokens) if req.continuous_usage else None
            chunk = P.choice(c.index, {"text": text}, lp, finish, stop)
            yield P.response(a.rid, a.created, model.name, "text_completion", [chunk], usage)
        if out.finished and req.include_usage:
            yield P.usage_chunk(a.rid, a.created, model.name, "text_completion", usage_of(a, out))


def completion_routes(model: ServedModel, async_engine: AsyncEngine) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/completions")
    async def completions(request: Request):
        a = await admit_request(request, P.CompletionRequest, completion_prompt_ids, "cmpl", model, async_engine)
        return await answer(request, a, lambda: completion_chunks(model, a), lambda out: completion_body(model, a, out))

    return router
