"""Tool-call parsers chosen by name (`server.tool_parser`), reading the JSON-based formats of vLLM's parsers
(vllm/entrypoints/openai/tool_parsers/): each finds where the tool calls begin in a model's output and reads
the calls as {"name", "arguments"} objects (llama3 and phi-4 also spell arguments "parameters").

  hermes          <tool_call>{"name": ..., "arguments": {...}}</tool_call>, once per call; text before is content
  llama3_json     the output itself: [<|python_tag|>]{"name": ..., "parameters": {...}}; {...}; no content
  mistral         [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]; text before is content
  granite         <|tool_call|>[{"name": ..., "arguments": {...}}, ...]
  jamba           <tool_calls>[{"name": ..., "arguments": {...}}, ...]</tool_calls>
  phi4_mini_json  functools[{"name": ..., "arguments": {...}}, ...]

Deviation from vLLM: a streamed reply sends its content as it comes but each tool call whole, in one delta
when the output ends (vLLM streams the arguments text as it is generated); clients that join the argument
deltas get the same result. Output that does not parse as tool calls is returned as content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, as OpenAI returns it


@dataclass(frozen=True)
class ToolParser:
    name: str
    start: str  # the marker where tool calls begin
    end: str = ""  # the marker where a call (per_call) or the list of calls ends
    per_call: bool = False  # start...end wraps each call (hermes) rather than all of them
    at_start_only: bool = False  # calls only at the output's start, where a bare "{" also begins them
    example: str = ""  # one call in this format, for a chat template that does not render tools

    def find_start(self, text: str) -> int | None:
        """Where the tool calls begin in text, or None (no tool call, so far)."""
        if self.at_start_only:
            body = text.lstrip()
            if body.startswith(self.start) or body.startswith("{"):
                return len(text) - len(body)
            return None
        i = text.find(self.start)
        return None if i < 0 else i

    def holdback(self, text: str) -> int:
        """How many trailing characters of text might still turn into the start marker (not sent yet)."""
        if self.at_start_only:
            body = text.lstrip()
            return len(text) if self.start.startswith(body) else 0
        for k in range(min(len(self.start) - 1, len(text)), 0, -1):
            if self.start.startswith(text[-k:]):
                return k
        return 0

    def extract(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """(content, calls); no calls when none parse (the whole text is then content)."""
        at = self.find_start(text)
        if at is None:
            return text, []
        content = text[:at] if not self.at_start_only else ""
        calls: list[ParsedCall] = []
        for segment in self._segments(text[at:]):
            parsed = _calls(segment)
            if parsed is None:
                return text, []
            calls += parsed
        if not calls:
            return text, []
        return (content or None), calls

    def _segments(self, text: str) -> list[str]:
        if self.per_call:
            parts = text.split(self.start)[1:]
            return [p.split(self.end, 1)[0] if self.end else p for p in parts]
        body = text[len(self.start) :] if text.startswith(self.start) else text
        return [body.split(self.end, 1)[0] if self.end else body]


def _calls(segment: str) -> list[ParsedCall] | None:
    """The calls in a run of JSON objects or arrays (separated by whitespace, ";" or ","), or None."""
    decoder, pos, values = json.JSONDecoder(), 0, []
    while True:
        while pos < len(segment) and segment[pos] in " \t\r\n;,":
            pos += 1
        if pos >= len(segment):
            break
        try:
            value, pos = decoder.raw_decode(segment, pos)
        except json.JSONDecodeError:
            return None
        values += value if isinstance(value, list) else [value]
    calls = []
    for v in values:
        if not isinstance(v, dict) or not isinstance(v.get("name"), str):
            return None
        args = v.get("arguments", v.get("parameters", {}))
        calls.append(ParsedCall(v["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
    return calls


_CALL = '{"name": "<function name>", "arguments": {<arguments>}}'
_LLAMA = '{"name": "<function name>", "parameters": {<arguments>}}'
PARSERS: dict[str, ToolParser] = {
    p.name: p
    for p in (
        ToolParser("hermes", "<tool_call>", "</tool_call>", True, example=f"<tool_call>\n{_CALL}\n</tool_call>"),
        ToolParser("llama3_json", "<|python_tag|>", at_start_only=True, example=_LLAMA),
        ToolParser("mistral", "[TOOL_CALLS]", example=f"[TOOL_CALLS][{_CALL}]"),
        ToolParser("granite", "<|tool_call|>", example=f"<|tool_call|>[{_CALL}]"),
        ToolParser("jamba", "<tool_calls>", "</tool_calls>", example=f"<tool_calls>[{_CALL}]</tool_calls>"),
        ToolParser("phi4_mini_json", "functools", example=f"functools[{_CALL}]"),
    )
}


def tool_parser(name: str | None) -> ToolParser | None:
    """The parser of this name (None: none, tool_choice "auto" is then refused); ValueError naming the known."""
    if name is None:
        return None
    if name not in PARSERS:
        raise ValueError(f"server.tool_parser={name!r} is not one of {sorted(PARSERS)} (or null)")
    return PARSERS[name]
