"""A /v1/completions call with several prompts: one engine request per prompt, all checked before any is
added (a bad prompt fails the whole call with 400 and nothing runs), then added together so the scheduler
batches them. Request ids are `<call id>-<prompt index>`, as vLLM's serving_completion names them."""

from __future__ import annotations

from fastapi import Request

from testbed.server import protocol as P
from testbed.server.async_engine import AsyncEngine
from testbed.server.request_input import (
    Admitted,
    _add_to_engine,
    _field,
    check_prompt_size,
    check_request,
    compile_constraint,
    completion_prompt_ids,
    parse_request,
    sampling_params,
)
from testbed.server.served_model import ServedModel


def _all_prompt_ids(tokenizer, prompts: list, model: ServedModel) -> list[list[int]]:
    return [completion_prompt_ids(tokenizer, p, model) for p in prompts]


async def admit_prompts(request: Request, model: ServedModel, async_engine: AsyncEngine) -> list[Admitted]:
    """The call's prompts as admitted engine requests, in prompt order (sharing req, params, created)."""
    arrival = async_engine.engine.clock()
    req = await parse_request(request, P.CompletionRequest, model)
    params = sampling_params(req, model)
    check_prompt_size(req, model)
    prompts = req.prompts()
    all_ids = await model.tokenizers.run(_all_prompt_ids, prompts, model)  # off the event loop
    await compile_constraint(async_engine, req, params)  # once for the call: the prompts share it
    rid, created = P.random_id("cmpl"), P.now_s()
    batch: list[Admitted] = []
    try:
        for i, ids in enumerate(all_ids):
            try:
                check_request(async_engine, model, ids, params)
            except P.APIError as e:
                if len(prompts) > 1:
                    e.message = f"prompt {i}: {e.message}"
                raise
        for i, (prompt, ids) in enumerate(zip(prompts, all_ids)):
            sub_id = rid if len(prompts) == 1 else f"{rid}-{i}"
            stream = _add_to_engine(async_engine, model, ids, params, sub_id, arrival, req.priority)
            batch.append(Admitted(req, params, ids, rid, created, stream, prompt))
    except P.APIError as e:  # a refusal part-way (a full queue): what was added does not run either
        for a in batch:
            a.stream.abort()
        e.param = _field(req, e.param)
        raise
    return batch
