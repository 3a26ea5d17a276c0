"""From an HTTP request to an engine request: JSON body -> validated OpenAI request -> prompt token ids
(tokenized and chat-templated in a worker thread) and SamplingParams -> admitted RequestStream. Every refusal
is an APIError (an OpenAI-style error body)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from pydantic import ValidationError

from testbed.sampling_params import SamplingParams
from testbed.server import protocol as P
from testbed.server.async_engine import (
    AsyncEngine,
    QueueFullError,
    RequestStream,
    ShuttingDownError,
)
from testbed.server.json_body import parse_json_object
from testbed.server.served_model import ServedModel


async def parse_request(request: Request, model_cls, model: ServedModel):
    data = parse_json_object(await request.body())  # the body's size and arrival time: body_limits.py
    try:
        req = model_cls.model_validate(data)
    except ValidationError as e:
        raise P.validation_error_to_api_error(e) from e
    except RecursionError:  # a nesting the parser took but the validator did not
        raise P.APIError("a value in the body is nested too deeply", 400, code="invalid_value") from None
    if req.model != model.name:
        raise P.APIError(
            f"The model `{req.model}` does not exist (this server serves `{model.name}`).",
            404,
            "invalid_request_error",
            "model",
            "model_not_found",
        )
    return req


def sampling_params(req, model: ServedModel) -> SamplingParams:
    try:
        params = req.to_sampling_params()
    except (ValueError, TypeError) as e:  # SamplingParamError / StructuredOutputError name the parameter
        raise P.APIError(str(e), 400, param=_field(req, getattr(e, "param", None)), code="invalid_value") from e
    so = params.structured_outputs
    if so is not None and so.max_whitespace != model.json_max_whitespace:  # the server's bound (settings)
        params.structured_outputs = dataclasses.replace(so, max_whitespace=model.json_max_whitespace)
    return params


def _field(req, param: str | None) -> str | None:
    """A constraint's errors name the field the client used (response_format, guided_json, ...)."""
    return (req.constraint_field or param) if param == "structured_outputs" else param


def _prompt_too_long(n: int, limit: int, param: str) -> P.APIError:
    return P.APIError(
        f"the prompt has {n} characters, more than the server's limit of {limit} (server.max_prompt_chars)",
        400,
        param=param,
        code="prompt_too_long",
    )


def check_prompt_size(req, model: ServedModel) -> None:
    """Text longer than max_prompt_chars is refused before it is tokenized."""
    if isinstance(req, P.ChatCompletionRequest):
        n, param = sum(len(m.text()) for m in req.messages), "messages"
    else:  # every prompt of a batch together
        n, param = sum(len(p) for p in req.prompts() if isinstance(p, str)), "prompt"
    if n > model.max_prompt_chars:
        raise _prompt_too_long(n, model.max_prompt_chars, param)


def completion_prompt_ids(tokenizer, prompt: str | list[int], model: ServedModel) -> list[int]:
    """One completion prompt's token ids (a string is encoded with the tokenizer's special tokens)."""
    if not isinstance(prompt, str):
        return list(prompt)
    if tokenizer is None:
        raise P.APIError(
            f"model `{model.name}` has no tokenizer: send the prompt as a list of token ids", 400, param="prompt"
        )
    return tokenizer.encode(prompt)


async def compile_constraint(async_engine: AsyncEngine, req, params: SamplingParams) -> None:
    """Compile the output constraint in the grammar pool (off the event loop and the stepping thread),
    so admission finds it compiled; a constraint over a limit, unsatisfiable or slow to compile is a 400."""
    if params.structured_outputs is None:
        return
    grammars = async_engine.engine.sampler.grammars
    try:
        await grammars.compile_async(params.structured_outputs)
    except ValueError as e:  # StructuredOutputError
        raise P.APIError(str(e), 400, param=_field(req, "structured_outputs"), code="invalid_value") from e


@dataclass
class Admitted:
    """A request the engine has taken: what answering it needs."""

    req: Any  # the validated protocol request
    params: SamplingParams
    prompt_ids: list[int]
    rid: str
    created: int
    stream: RequestStream
    prompt: str | list[int] | None = None  # as the client sent it (completions' echo)


async def admit_request(
    request: Request,
    model_cls,
    prompt_ids_of: Callable[[Any, Any, ServedModel], list[int]],  # (tokenizer, request, model), in a worker thread
    id_prefix: str,
    model: ServedModel,
    async_engine: AsyncEngine,
) -> Admitted:
    arrival = async_engine.engine.clock()  # TTFT includes parsing and tokenizing
    req = await parse_request(request, model_cls, model)
    params = sampling_params(req, model)
    check_prompt_size(req, model)
    prompt_ids = await model.tokenizers.run(prompt_ids_of, req, model)  # off the event loop
    await compile_constraint(async_engine, req, params)
    rid, created = P.random_id(id_prefix), P.now_s()
    try:
        stream = _add_to_engine(async_engine, model, prompt_ids, params, rid, arrival, req.priority)
    except P.APIError as e:  # a constraint the grammar engine refused: name the field the client used
        e.param = _field(req, e.param)
        raise
    return Admitted(req, params, prompt_ids, rid, created, stream)


def _check_context(model: ServedModel, prompt_ids: list[int], params: SamplingParams) -> None:
    n, max_len = len(prompt_ids), model.max_model_len
    if params.max_tokens is not None and n + params.max_tokens > max_len:
        raise P.APIError(
            f"This model's maximum context length is {max_len} tokens. However, you "
            f"requested {n + params.max_tokens} tokens ({n} in the prompt, {params.max_tokens} "
            f"in the completion). Please reduce the prompt or max_tokens.",
            400,
            param="prompt" if n >= max_len else "max_tokens",
            code="context_length_exceeded",
        )


def _engine_refusal(e: ValueError) -> P.APIError:
    """The engine's checks; sampling ones (vocabulary, grammar) name their parameter."""
    param = getattr(e, "param", None)
    code = "invalid_value" if param else "invalid_prompt"
    return P.APIError(str(e), 400, param=param or "prompt", code=code)


def check_request(async_engine: AsyncEngine, model: ServedModel, prompt_ids: list[int], params: SamplingParams) -> None:
    """Every check adding the request would make, without adding it (a batch is checked whole first)."""
    _check_context(model, prompt_ids, params)
    try:
        async_engine.validate(prompt_ids, params)
    except ValueError as e:
        raise _engine_refusal(e) from e


def _add_to_engine(
    async_engine: AsyncEngine,
    model: ServedModel,
    prompt_ids: list[int],
    params: SamplingParams,
    rid: str,
    arrival: float,
    priority: int = 0,
) -> RequestStream:
    _check_context(model, prompt_ids, params)
    try:
        return async_engine.add_request(prompt_ids, params, rid, arrival, priority)
    except ValueError as e:
        raise _engine_refusal(e) from e
    except QueueFullError as e:
        raise P.APIError(str(e), 503, "service_unavailable_error", code="queue_full") from e
    except ShuttingDownError as e:
        raise P.APIError(str(e), 503, "service_unavailable_error", code="shutting_down") from e
