"""Output constraints in a request body: OpenAI's response_format, vLLM's structured_outputs and guided_*
fields, folded into one StructuredOutputsParams (testbed.structured)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from testbed.sampling_params import SamplingParamError
from testbed.structured import StructuredOutputsParams

GUIDED = ("json", "regex", "choice", "grammar")  # vLLM's guided_<kind> request fields


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)
    name: str = "schema"
    description: str | None = None
    json_schema: dict | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: text, json_object or json_schema."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema(self):
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.json_schema is None):
            raise ValueError('response_format of type "json_schema" needs json_schema.schema')
        return self


class StructuredOutputsField(BaseModel):
    """vLLM's `structured_outputs` request field (its StructuredOutputsParams)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    json_: str | dict | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False


def constraint_field(req) -> str | None:
    """The request field that carries its output constraint (named in error bodies), or None."""
    fmt = req.response_format
    if req.structured_outputs is not None:
        return "structured_outputs"
    if fmt is not None and fmt.type != "text":
        return "response_format"
    return next((f"guided_{n}" for n in GUIDED if getattr(req, f"guided_{n}") is not None), None)


def output_constraint(req) -> StructuredOutputsParams | None:
    """The request's one output constraint, from vLLM's structured_outputs, its older guided_json /
    guided_regex / guided_choice / guided_grammar, or OpenAI's response_format (json_object /
    json_schema); two constraints of one kind are an error naming the field."""
    found = {}
    if req.structured_outputs is not None:
        so = req.structured_outputs
        kinds = {"json": so.json_, "regex": so.regex, "choice": so.choice, "grammar": so.grammar}
        found.update({k: v for k, v in kinds.items() if v is not None})
        if so.json_object:
            found["json_object"] = True
        if not found:  # `structured_outputs: {}` would otherwise generate unconstrained text
            raise SamplingParamError(
                "structured_outputs", "structured_outputs names no constraint: give one of json, regex, choice, grammar"
            )
    for name in GUIDED:
        value = getattr(req, f"guided_{name}")
        if value is not None:
            if name in found:
                message = f"guided_{name} given twice (also in structured_outputs)"
                raise SamplingParamError(f"guided_{name}", message)
            found[name] = value
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        key = "json_object" if fmt.type == "json_object" else "json"
        if key in found:
            raise SamplingParamError("response_format", f"response_format and another {key} constraint given")
        found[key] = True if fmt.type == "json_object" else fmt.json_schema.json_schema
    if not found:
        return None
    whitespace = bool(req.structured_outputs and req.structured_outputs.disable_any_whitespace)
    return StructuredOutputsParams(**found, disable_any_whitespace=whitespace)
