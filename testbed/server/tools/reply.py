"""The assistant's reply when a tool call was possible: its content and tool_calls (OpenAI's shapes), whole
or as streaming deltas. tool_choice "auto": the server's parser reads the calls; "required": the output is
the JSON array choice.py constrained it to; a named function: the output is that function's arguments.
finish_reason becomes "tool_calls" when an "auto" or "required" reply ends in calls (a named choice keeps
"stop", as OpenAI and vLLM answer)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from testbed.server import protocol as P
from testbed.server.tools.parsers import ParsedCall, ToolParser
from testbed.server.tools.spec import NamedToolChoice


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call_json(call: ParsedCall, index: int | None = None) -> dict:
    body = {"id": call_id(), "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    return body if index is None else {"index": index, **body}


@dataclass(frozen=True)
class ToolReply:
    mode: str  # "auto" | "required" | "named"
    parser: ToolParser | None
    function: str | None = None  # named
    parallel: bool = True

    def calls(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """(content, calls) of a finished output; no calls: all of it is content."""
        if self.mode == "named":
            return None, [ParsedCall(self.function or "", text)]
        if self.mode == "required":
            try:
                items = json.loads(text)
                calls = [ParsedCall(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in items]
            except (json.JSONDecodeError, TypeError, KeyError):  # cut off by max_tokens
                return text, []
            return None, calls
        assert self.parser is not None
        content, calls = self.parser.extract(text)
        return content, (calls if self.parallel else calls[:1])

    def finish_reason(self, calls: list, finish_reason: str | None) -> str | None:
        return "tool_calls" if calls and self.mode != "named" and finish_reason == "stop" else finish_reason

    def message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        content, calls = self.calls(text)
        message: dict = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [call_json(c) for c in calls]
        return message, self.finish_reason(calls, finish_reason)


@dataclass
class ToolDeltas:
    """One choice's stream: content is sent as it comes until the tool calls may begin; the calls go whole
    in the choice's last delta."""

    reply: ToolReply
    text: str = ""
    sent: int = 0  # characters of text already sent as content
    in_calls: bool = field(default=False)

    def add(self, piece: str) -> str:
        """The content to send for this piece of output."""
        self.text += piece
        parser = self.reply.parser
        if self.reply.mode != "auto" or self.in_calls or parser is None:
            return ""
        at = parser.find_start(self.text)
        if at is not None:
            self.in_calls = True
            upto = at
        else:
            upto = len(self.text) - parser.holdback(self.text)
        out = self.text[self.sent : upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        return out

    def finish(self, finish_reason: str | None) -> tuple[dict, str | None]:
        """The last delta (rest of the content, the tool calls) and the choice's finish_reason."""
        content, calls = self.reply.calls(self.text)
        delta: dict = {}
        rest = self.text[self.sent :] if not calls else (content or "")[self.sent :]
        if rest:
            delta["content"] = rest
        if calls:
            delta["tool_calls"] = [call_json(c, i) for i, c in enumerate(calls)]
        return delta, self.reply.finish_reason(calls, finish_reason)


def tool_reply(req: P.ChatCompletionRequest, parser: ToolParser | None) -> ToolReply | None:
    """How to read this request's output, or None where no tool call is possible."""
    choice = req.effective_tool_choice
    if not req.tools or choice == "none":
        return None
    if isinstance(choice, NamedToolChoice):
        return ToolReply("named", parser, choice.function.name, req.parallel_tool_calls)
    return ToolReply(choice, parser, None, req.parallel_tool_calls)
