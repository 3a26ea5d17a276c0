"""POST /tokenize and /detokenize with vLLM's request and response shapes
(vllm/entrypoints/openai/protocol.py: TokenizeCompletionRequest, TokenizeChatRequest, TokenizeResponse,
DetokenizeRequest, DetokenizeResponse), and GET /version. A tokenize body holds `prompt` (text, encoded with
the tokenizer's special tokens unless add_special_tokens is false) or `messages` (rendered through the chat
template, with tools if given, as /v1/chat/completions renders them for tool_choice "auto"; special tokens
off by default).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from testbed.server import protocol as P
from testbed.server.json_body import parse_json_object
from testbed.server.served_model import ServedModel
from testbed.server.tools.parsers import ToolParser
from testbed.server.tools.render import render_chat
from testbed.server.tools.spec import Tool


class TokenizeCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    messages: list[P.ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # the template writes them (vLLM's default for chat)
    return_token_strs: bool = False
    tools: list[Tool] | None = None

    @model_validator(mode="after")
    def _generation_prompt(self):
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        return self


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    tokens: list[int]  # each in the vocabulary (checked by the route: its size is the model's)


def _parse(data: dict, cls):
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise P.validation_error_to_api_error(e) from e


def _check_model(model: ServedModel, name: str | None) -> None:
    if name is not None and name != model.name:
        raise P.APIError(
            f"The model `{name}` does not exist (this server serves `{model.name}`).",
            404,
            param="model",
            code="model_not_found",
        )


def _need_tokenizer(model: ServedModel, tok) -> None:
    if tok is None:
        raise P.APIError(f"model `{model.name}` has no tokenizer", 400, code="no_tokenizer")


def _tokenize(tok, req, model: ServedModel, parser: ToolParser | None) -> list[int]:
    _need_tokenizer(model, tok)
    if isinstance(req, TokenizeChatRequest):
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        text = render_chat(
            tok, model, [m.template_dict() for m in req.messages], tools, req.add_generation_prompt,
            req.continue_final_message, parser, state_tools=True,
        )  # fmt: skip
    else:
        text = req.prompt
    return tok.encode(text, add_special_tokens=req.add_special_tokens)


def _detokenize(tok, tokens: list[int], model: ServedModel) -> str:
    _need_tokenizer(model, tok)
    return tok.decode(tokens)


def tokenize_routes(model: ServedModel, parser: ToolParser | None = None) -> APIRouter:
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(request: Request):
        data = parse_json_object(await request.body())
        req = _parse(data, TokenizeChatRequest if "messages" in data else TokenizeCompletionRequest)
        _check_model(model, req.model)
        if isinstance(req, TokenizeCompletionRequest) and len(req.prompt) > model.max_prompt_chars:
            raise P.APIError(
                f"the prompt has {len(req.prompt)} characters, more than the server's limit of "
                f"{model.max_prompt_chars} (server.max_prompt_chars)",
                400,
                param="prompt",
                code="prompt_too_long",
            )
        ids = await model.tokenizers.run(_tokenize, req, model, parser)
        body = {"count": len(ids), "max_model_len": model.max_model_len, "tokens": ids, "token_strs": None}
        if req.return_token_strs:
            body["token_strs"] = model.tokenizer.convert_ids_to_tokens(ids)
        return body

    @router.post("/detokenize")
    async def detokenize(request: Request):
        req = _parse(parse_json_object(await request.body()), DetokenizeRequest)
        _check_model(model, req.model)
        bad = [t for t in req.tokens if not 0 <= t < model.vocab_limit]
        if bad:
            raise P.APIError(
                f"token ids out of the vocabulary [0, {model.vocab_limit}): {bad[:8]}",
                400,
                param="tokens",
                code="invalid_value",
            )
        return {"prompt": await model.tokenizers.run(_detokenize, req.tokens, model)}

    return router


def version_routes() -> APIRouter:
    router = APIRouter()

    @router.get("/version")
    async def server_version():
        try:
            return {"version": version("testbed")}
        except PackageNotFoundError:  # run from a source tree that was never installed
            return {"version": "unknown"}

    return router
