"""What a request constrains its output to: vLLM's StructuredOutputsParams (vllm/sampling_params.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# Longest run of free whitespace in constrained JSON (xgrammar's max_whitespace_cnt). Unbounded (vLLM's
# default), a small model can write newlines until max_tokens instead of closing the object.
JSON_MAX_WHITESPACE = 16


class StructuredOutputError(ValueError):
    """A constraint that cannot be used: malformed, unsupported or unsatisfiable (HTTP 400)."""

    param = "structured_outputs"


@dataclass
class StructuredOutputsParams:
    """Exactly one constraint. `json`: a JSON schema (dict or its text); `json_object`: any JSON object
    (OpenAI's response_format json_object); `regex`; `choice`: one of these strings; `grammar`: EBNF in
    xgrammar's (GBNF-style) syntax. `disable_any_whitespace`: JSON without free whitespace (vLLM's flag);
    otherwise `max_whitespace` bounds each whitespace run (None: unbounded)."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False
    disable_any_whitespace: bool = False
    max_whitespace: int | None = JSON_MAX_WHITESPACE
    # (GrammarBackend, its compiled grammar): set once compiled, so the sampler never compiles again
    _compiled: tuple[Any, Any] = field(default=(None, None), init=False, repr=False, compare=False)

    def __post_init__(self):
        ws = self.max_whitespace
        if ws is not None and (not isinstance(ws, int) or isinstance(ws, bool) or ws < 1):
            raise StructuredOutputError(f"max_whitespace must be an integer >= 1 or None, got {ws!r}")
        kinds = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None]
        kinds += ["json_object"] if self.json_object else []
        if len(kinds) != 1:
            raise StructuredOutputError(
                "structured outputs take exactly one of json, json_object, regex, choice, grammar; got "
                + (", ".join(kinds) if kinds else "none")
            )
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise StructuredOutputError(f"{name} must be a string, got {type(value).__name__}")
        if self.choice is not None:
            if isinstance(self.choice, (str, bytes)) or not isinstance(self.choice, (list, tuple)):
                raise StructuredOutputError(f"choice must be a list of strings, got {type(self.choice).__name__}")
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise StructuredOutputError("choice must be a non-empty list of non-empty strings")
            self.choice = list(self.choice)
        if isinstance(self.json, str):
            try:
                self.json = json.loads(self.json)
            except json.JSONDecodeError as e:
                raise StructuredOutputError(f"the JSON schema is not valid JSON: {e}") from e
            except RecursionError:
                raise StructuredOutputError("the JSON schema is nested too deeply to parse") from None
        if self.json is not None and not isinstance(self.json, (dict, bool)):
            raise StructuredOutputError(f"a JSON schema is an object, got {type(self.json).__name__}")

    @property
    def kind(self) -> str:
        if self.json_object:
            return "json_object"
        return next(k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None)

    def key(self) -> tuple:
        """Hashable identity of the constraint (the compile cache's key)."""
        if self.json is not None:
            return ("json", json.dumps(self.json, sort_keys=True), self.disable_any_whitespace, self.max_whitespace)
        if self.choice is not None:
            return ("choice", tuple(self.choice))
        if self.json_object:
            return ("json_object", self.disable_any_whitespace, self.max_whitespace)
        return (self.kind, getattr(self, self.kind))
