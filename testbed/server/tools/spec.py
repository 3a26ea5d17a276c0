"""The request fields of tool calling, as OpenAI defines them: `tools` (functions with JSON-schema
parameters) and `tool_choice` ("none", "auto", "required" or {"type": "function", "function": {"name"}})."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")  # OpenAI's rule (and dots)
    description: str | None = None
    parameters: dict | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def parameters_schema(function: FunctionDefinition) -> dict:
    """The function's arguments schema ({} of an object when it declares none)."""
    return function.parameters if function.parameters is not None else {"type": "object", "properties": {}}
