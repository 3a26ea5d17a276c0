"""OpenAI-compatible request/response bodies (pydantic), and the mapping onto SamplingParams.

Requests are validated strictly (no silent "1" -> 1 coercion): a wrong type, a missing field or a value
out of range is an OpenAI-style error body with HTTP 400, built by `error_body`.
Extensions beyond OpenAI's names, as vLLM spells them: top_k, min_p, ignore_eos, stop_token_ids,
stream_options.continuous_usage_stats (usage on every streamed chunk), repetition_penalty, min_tokens,
bad_words, allowed_token_ids, prompt_logprobs, structured_outputs and the older guided_json /
guided_regex / guided_choice / guided_grammar, return_token_ids (the prompt's and each choice's token ids
in the answer, where vLLM puts them: completions on each choice, chat the prompt's at the top level; a
stream sends the prompt's once and each chunk's new token ids). Sampling parameters the engine defines are range-checked
by SamplingParams itself, so HTTP and in-process callers get the same messages.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from typing_extensions import TypeIs  # pydantic's dependency; typing's from Python 3.13

from testbed.sampling_params import SamplingParamError, SamplingParams
from testbed.server.output_constraints import (
    ResponseFormat,
    StructuredOutputsField,
    constraint_field,
    output_constraint,
)
from testbed.server.tools.choice import tool_schema
from testbed.server.tools.spec import NamedToolChoice, Tool, ToolChoice
from testbed.structured import StructuredOutputsParams


class APIError(Exception):
    """An error the server answers with an OpenAI-style body."""

    def __init__(
        self,
        message: str,
        status_code: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.message, self.status_code, self.type, self.param, self.code = message, status_code, type, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def validation_error_to_api_error(exc: ValidationError) -> APIError:
    errors = exc.errors(include_url=False)
    loc = errors[0].get("loc", ()) if errors else ()
    param = str(loc[0]) if loc else None
    messages = []
    for err in errors[:4]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        msg = err["msg"].removeprefix("Value error, ")
        messages.append(f"{where}: {msg}" if where else msg)
    return APIError("; ".join(messages), 400, "invalid_request_error", param, "invalid_value")


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# ---- requests ---------------------------------------------------------------------------------------
class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM extension: usage on every chunk


# OpenAI clamps logit_bias values to this range (vLLM does the same)
LOGIT_BIAS_LIMIT = 100.0


class _SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    model: str
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    n: int = 1  # range-checked by SamplingParams (vLLM's messages), the cache's fit by the engine
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)  # torch.Generator's range
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    priority: int = Field(default=0, ge=-(2**63), le=2**63 - 1)  # vLLM extension (policy-dependent)
    # vLLM extensions: logits processors, prompt logprobs, structured output
    repetition_penalty: float | None = None
    min_tokens: int = 0
    bad_words: list[str] | None = None
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    return_token_ids: bool = False
    structured_outputs: StructuredOutputsField | None = None
    guided_json: str | dict | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    response_format: ResponseFormat | None = None
    _constraint_field: str | None = PrivateAttr(default=None)  # set by structured(): the field for error bodies

    @model_validator(mode="after")
    def _unsupported(self):
        if isinstance(self.stop, list) and len(self.stop) > 16:
            raise ValueError("at most 16 stop sequences")
        if self.stop == "" or (isinstance(self.stop, list) and "" in self.stop):
            raise ValueError("stop sequences must be non-empty")
        return self

    def _max_tokens(self) -> int | None:
        return self.max_tokens

    def _logprobs(self) -> int | None:
        return None

    def default_max_tokens(self) -> int | None:
        return None

    def _logit_bias(self) -> dict[int, float]:
        """OpenAI's string token ids -> ints; values clamped to [-100, 100] (vLLM's protocol does the same)."""
        bias = {}
        for key, value in (self.logit_bias or {}).items():
            try:
                token = int(key)
            except ValueError:
                raise SamplingParamError(
                    "logit_bias", f"logit_bias keys must be token ids (integers as strings), got {key!r}"
                ) from None
            bias[token] = min(LOGIT_BIAS_LIMIT, max(-LOGIT_BIAS_LIMIT, value))
        return bias

    def _prompt_logprobs(self) -> int | None:
        return self.prompt_logprobs

    def _best_of(self) -> int | None:
        return None

    def structured(self) -> StructuredOutputsParams | None:
        """The one output constraint among structured_outputs, guided_*, response_format (json kinds)."""
        self._constraint_field = constraint_field(self)  # first: a constraint that fails names its field
        return output_constraint(self)

    def to_sampling_params(self) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        max_tokens = self._max_tokens()
        extras = {
            name: getattr(self, name)
            for name in ("presence_penalty", "frequency_penalty", "repetition_penalty")
            if getattr(self, name) is not None
        }
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            max_tokens=self.default_max_tokens() if max_tokens is None else max_tokens,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            seed=self.seed,
            logprobs=self._logprobs(),
            prompt_logprobs=self._prompt_logprobs(),
            logit_bias=self._logit_bias(),
            min_tokens=self.min_tokens,
            bad_words=list(self.bad_words or []),
            allowed_token_ids=self.allowed_token_ids,
            structured_outputs=self.structured(),
            n=self.n,
            best_of=self._best_of(),
            **extras,
        )

    @property
    def constraint_field(self) -> str | None:
        """The request field that carried the output constraint (after to_sampling_params)."""
        return self._constraint_field

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


def _several_prompts(prompt: str | list[int] | list[str] | list[list[int]]) -> TypeIs[list[str] | list[list[int]]]:
    """A batch of prompts ([str] | [[int]]) rather than one (str | [int])."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))


class CompletionRequest(_SamplingFields):
    # one prompt (str | [int]) or a batch ([str] | [[int]]): one engine request per prompt, choices
    # indexed prompt * n + j as OpenAI and vLLM do
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None  # k: the sampled token + the k most likely, k <= 20 (checked by SamplingParams)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, prompt):
        if isinstance(prompt, list) and not prompt:
            raise ValueError("an empty list: send a string, token ids, or a list of them")
        if isinstance(prompt, list) and any(isinstance(p, list) and not p for p in prompt):
            raise ValueError("a prompt of token ids is empty")
        return prompt

    @model_validator(mode="after")
    def _suffix(self):
        if self.suffix:
            raise ValueError("suffix is not supported")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the call, in order (one for a string or a list of token ids)."""
        p = self.prompt
        if _several_prompts(p):
            return [*p]
        return [p]

    def default_max_tokens(self) -> int | None:
        return 16  # OpenAI's default for completions

    def _logprobs(self) -> int | None:
        return self.logprobs

    def _best_of(self) -> int | None:
        # OpenAI: best_of "results cannot be streamed" (the best n are known only at the end); vLLM then
        # answers with one JSON body instead of a stream, which a streaming client cannot read: refused here
        if self.stream and self.best_of is not None and self.best_of > self.n:
            raise SamplingParamError(
                "best_of", f"best_of={self.best_of} > n={self.n} cannot be streamed; set stream=false"
            )
        return self.best_of

    def _prompt_logprobs(self) -> int | None:
        # echo with logprobs scores the echoed prompt too (vLLM: prompt_logprobs = logprobs)
        if self.echo and self.logprobs is not None and self.prompt_logprobs is None:
            return self.logprobs
        return self.prompt_logprobs


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str
    arguments: str  # JSON text

    @model_validator(mode="after")
    def _json(self):
        try:
            json.loads(self.arguments)
        except json.JSONDecodeError as e:
            raise ValueError(f"the arguments of tool call {self.name!r} are not JSON: {e}") from None
        return self


class MessageToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool result: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def template_dict(self) -> dict:
        """The message as chat templates read it (tool-call arguments as objects, as vLLM passes them)."""
        d: dict = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.name is not None:
            d["name"] = self.name
        if self.tool_calls:
            d["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": json.loads(c.function.arguments)},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    add_generation_prompt: bool = True  # vLLM extension
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None  # default: "auto" with tools, else "none" (OpenAI)
    parallel_tool_calls: bool = True
    functions: Any = None  # OpenAI's deprecated function calling: refused
    function_call: Any = None

    @model_validator(mode="after")
    def _chat(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return self

    def _check_tools(self) -> None:
        """Refusals naming their field (SamplingParamError carries it to the error body)."""
        for old in ("functions", "function_call"):
            if getattr(self, old) is not None:
                raise SamplingParamError(old, f"{old} (deprecated) is not supported: use tools and tool_choice")
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise SamplingParamError("tools", f"tools has two functions of one name: {names}")
        choice = self.tool_choice
        if choice is not None and choice != "none" and not names:
            raise SamplingParamError("tool_choice", f"tool_choice {_choice_name(choice)} needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise SamplingParamError(
                "tool_choice", f"tool_choice names function {choice.function.name!r}, which is not in tools {names}"
            )

    @property
    def effective_tool_choice(self):
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def structured(self) -> StructuredOutputsParams | None:
        """tool_choice required / named: the tools' schema; otherwise the request's own constraint."""
        self._check_tools()
        own = super().structured()
        schema = tool_schema(self.tools, self.effective_tool_choice, self.parallel_tool_calls)
        if schema is None:
            return own
        if own is not None:
            raise SamplingParamError(
                "tool_choice",
                f"tool_choice {self.tool_choice!r} constrains the output; it cannot be combined with "
                f"{self._constraint_field}",
            )
        self._constraint_field = "tool_choice"
        return StructuredOutputsParams(json=schema)

    def _max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def _logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def conversation(self) -> list[dict]:
        return [m.template_dict() for m in self.messages]

    def tool_dicts(self) -> list[dict] | None:
        """The tools as chat templates take them."""
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None


def _choice_name(choice) -> str:
    return repr(choice) if isinstance(choice, str) else f"naming function {choice.function.name!r}"


# ---- responses ------------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    """OpenAI's usage; prompt_tokens_details.cached_tokens = prompt tokens served from the prefix cache."""
    body: dict[str, int | dict[str, int]] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


def now_s() -> int:
    return int(time.time())


def choice(index: int, content: dict, logprobs: dict | None, finish_reason: str | None, stop_reason=None) -> dict:
    """One choice of a body or chunk; content: {"text": ...}, {"message": ...} or {"delta": ...}."""
    return {"index": index, **content, "logprobs": logprobs, "finish_reason": finish_reason, "stop_reason": stop_reason}


def response(rid: str, created: int, model: str, obj: str, choices: list[dict], usage_: dict | None = None) -> dict:
    """The envelope every completion body and chunk shares ("text_completion", "chat.completion",
    "chat.completion.chunk"); usage only when given."""
    body = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
    if usage_ is not None:
        body["usage"] = usage_
    return body


def usage_chunk(rid: str, created: int, model: str, obj: str, usage_: dict) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage_}


def model_list(model: str, created: int, max_model_len: int, vocab_size: int | None = None) -> dict:
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "testbed",
        "root": model,
        "max_model_len": max_model_len,
        "vocab_size": vocab_size,
    }  # the last two: for trace replay
    return {"object": "list", "data": [card]}
