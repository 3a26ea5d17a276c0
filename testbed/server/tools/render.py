"""A conversation (and its tools) through the model's chat template, as vLLM does: transformers'
apply_chat_template(messages, tools=...). Assistant tool calls carry their arguments as objects, as chat
templates expect (vLLM parses the JSON text the client sent back the same way).

Deviation from vLLM: when a tool call is wanted (tool_choice auto, required or named) and the template
ignores `tools` (SmolLM2's, for one), the tools and the call format of the server's tool parser are stated
in a system message, so the model sees what it may call; vLLM leaves that to a --chat-template override.
"""

from __future__ import annotations

import json

from testbed.server import protocol as P
from testbed.server.tools.parsers import ToolParser


def tools_instruction(tools: list[dict], parser: ToolParser | None) -> str:
    functions = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    text = f"You may call these functions (JSON schemas):\n<tools>\n{functions}\n</tools>"
    if parser is not None and parser.example:
        text += f"\nTo call a function, answer with:\n{parser.example}"
    return text


def _with_instruction(messages: list[dict], instruction: str) -> list[dict]:
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0], content=f"{messages[0].get('content') or ''}\n\n{instruction}".lstrip())
        return [first, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]


def _apply(tok, messages, tools, add_generation_prompt: bool, continue_final_message: bool) -> str:
    kwargs = {"continue_final_message": True} if continue_final_message else {}
    return tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
    )


def render_chat(
    tok,
    model,
    messages: list[dict],
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    parser: ToolParser | None = None,
    state_tools: bool = False,
) -> str:
    """The prompt text; state_tools: say the tools in a system message if the template ignores them."""
    if tok is None or not getattr(tok, "chat_template", None):
        raise P.APIError(f"model `{model.name}` has no chat template", 400, param="messages")
    try:
        text = _apply(tok, messages, tools, add_generation_prompt, continue_final_message)
        if tools and state_tools and text == _apply(tok, messages, None, add_generation_prompt, continue_final_message):
            text = _apply(tok, _with_instruction(messages, tools_instruction(tools, parser)), None,
                          add_generation_prompt, continue_final_message)  # fmt: skip
    except P.APIError:
        raise
    except Exception as e:  # template errors (e.g. a role it rejects) are the caller's
        raise P.APIError(f"the chat template rejected the messages: {e}", 400, param="messages") from e
    return text


def chat_prompt_ids(tok, req: P.ChatCompletionRequest, model, parser: ToolParser | None) -> list[int]:
    """A chat request's prompt token ids, its tools rendered; tool_choice "auto" needs the server's parser."""
    choice = req.effective_tool_choice
    if req.tools and choice == "auto" and parser is None:
        raise P.APIError(
            'tool_choice "auto" needs a tool-call parser: start the server with server.tool_parser=<name>',
            400,
            param="tool_choice",
            code="invalid_value",
        )
    text = render_chat(
        tok, model, req.conversation(), req.tool_dicts(), req.add_generation_prompt, parser=parser,
        state_tools=choice != "none",
    )  # fmt: skip
    return tok.encode(text, add_special_tokens=False)
