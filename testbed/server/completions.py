"""POST /v1/completions: a prompt (text or token ids) or a list of them in, their completions out, whole or
streamed. Each prompt is its own engine request (testbed/server/prompt_batch.py); choice k*n + j is the j-th
completion of prompt k, as in OpenAI's and vLLM's servers. echo: true puts the prompt before the completion
(and, with logprobs, the prompt tokens' logprobs first). return_token_ids: each choice carries
prompt_token_ids and the token_ids it generated (a stream: the prompt's on each choice's first chunk, then
each chunk's new ids), as vLLM's server does."""

from __future__ import annotations

from fastapi import APIRouter, Request

from testbed.outputs import RequestOutput
from testbed.server import protocol as P
from testbed.server.async_engine import AsyncEngine
from testbed.server.logprobs import completion_logprobs, prompt_logprobs_json
from testbed.server.prompt_batch import admit_prompts
from testbed.server.request_input import Admitted
from testbed.server.responses import answer_all, merged, usage_of
from testbed.server.served_model import ServedModel
from testbed.server.text_deltas import text_deltas


def echoed_prompt(model: ServedModel, a: Admitted) -> str:
    if isinstance(a.prompt, str):
        return a.prompt
    return model.tokenizer.decode(a.prompt_ids) if model.tokenizer is not None else ""


def completion_choices(model: ServedModel, a: Admitted, out: RequestOutput, first: int) -> list[dict]:
    """One choice per returned completion of one prompt (n, or the best n of best_of), from index first."""
    choices = []
    for i, c in enumerate(out.outputs):
        text, token_ids, entries = c.text, c.token_ids, c.logprobs or []
        if a.req.echo:
            text = echoed_prompt(model, a) + text
            if out.prompt_logprobs is not None:
                token_ids, entries = a.prompt_ids + token_ids, out.prompt_logprobs + entries
        lp = completion_logprobs(model.tokenizer, token_ids, entries, 0) if a.params.logprobs is not None else None
        choice = P.choice(first + i, {"text": text}, lp, c.finish_reason, c.stop_reason)
        if a.req.prompt_logprobs is not None and out.prompt_logprobs is not None:  # vLLM: on the choice
            choice["prompt_logprobs"] = prompt_logprobs_json(model.tokenizer, out.prompt_logprobs)
        if a.req.return_token_ids:
            choice["prompt_token_ids"], choice["token_ids"] = list(a.prompt_ids), list(c.token_ids)
        choices.append(choice)
    return choices


def total_usage(batch: list[Admitted], outs: list[RequestOutput]) -> dict:
    usages = [usage_of(a, out) for a, out in zip(batch, outs)]
    cached = sum(u.get("prompt_tokens_details", {}).get("cached_tokens", 0) for u in usages)
    return P.usage(sum(u["prompt_tokens"] for u in usages), sum(u["completion_tokens"] for u in usages), cached)


def completion_body(model: ServedModel, batch: list[Admitted], outs: list[RequestOutput]) -> dict:
    n, a0 = batch[0].params.n, batch[0]
    choices = [c for k, (a, out) in enumerate(zip(batch, outs)) for c in completion_choices(model, a, out, k * n)]
    return P.response(a0.rid, a0.created, model.name, "text_completion", choices, total_usage(batch, outs))


async def prompt_chunks(model: ServedModel, a: Admitted, first: int, finals: dict[int, RequestOutput]):
    """One chunk per engine output that adds to a choice of this prompt (index first + the choice's);
    the prompt's finished output lands in finals[first]."""
    req = a.req
    text_pos: dict[int, int] = {}  # choice index -> its text so far (logprobs' text_offset)
    echoed: set[int] = set()
    started: set[int] = set()
    async for d in text_deltas(model.tokenizer, a.params, a.stream):
        out, c = d.out, d.choice
        if out.finished:
            finals[first] = out
        if c is None:
            continue
        text, new, lps = d.text, d.new_token_ids, d.logprobs
        generated = list(new)
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
        chunk = P.choice(first + c.index, {"text": text}, lp, finish, stop)
        if req.return_token_ids:
            if c.index not in started:
                started.add(c.index)
                chunk["prompt_token_ids"] = list(a.prompt_ids)
            chunk["token_ids"] = generated
        yield P.response(a.rid, a.created, model.name, "text_completion", [chunk], usage)


async def completion_chunks(model: ServedModel, batch: list[Admitted]):
    """Every prompt's chunks as they come, then (include_usage) one usage chunk for the whole call."""
    n, a0 = batch[0].params.n, batch[0]
    finals: dict[int, RequestOutput] = {}
    async for chunk in merged([prompt_chunks(model, a, k * n, finals) for k, a in enumerate(batch)]):
        yield chunk
    if a0.req.include_usage:
        outs = [finals[k * n] for k in range(len(batch))]
        yield P.usage_chunk(a0.rid, a0.created, model.name, "text_completion", total_usage(batch, outs))


def completion_routes(model: ServedModel, async_engine: AsyncEngine) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/completions")
    async def completions(request: Request):
        batch = await admit_prompts(request, model, async_engine)
        return await answer_all(
            request, batch, lambda: completion_chunks(model, batch), lambda outs: completion_body(model, batch, outs)
        )

    return router
