"""Tool-call parsers (vLLM's JSON-based formats) and the streamed tool reply, without a server."""

import json

import pytest

from testbed.server import protocol as P
from testbed.server.settings import ServerSettings
from testbed.server.tools.choice import required_schema
from testbed.server.tools.parsers import PARSERS, ParsedCall, tool_parser
from testbed.server.tools.render import chat_prompt_ids, render_chat
from testbed.server.tools.reply import ToolDeltas, ToolReply
from testbed.server.tools.spec import Tool

ARGS = {"city": "Paris", "days": 2}
OUTPUTS = {
    "hermes": 'Let me look.<tool_call>\n{"name": "weather", "arguments": %s}\n</tool_call>\n'
    '<tool_call>{"name": "time", "arguments": {}}</tool_call>',
    "llama3_json": '<|python_tag|>{"name": "weather", "parameters": %s}; {"name": "time", "parameters": {}}',
    "mistral": 'Let me look.[TOOL_CALLS][{"name": "weather", "arguments": %s}, {"name": "time", "arguments": {}}]',
    "granite": '<|tool_call|>[{"name": "weather", "arguments": %s}, {"name": "time", "arguments": {}}]',
    "jamba": 'Let me look.<tool_calls>[{"name": "weather", "arguments": %s}, {"name": "time", "arguments": {}}]'
    "</tool_calls>",
    "phi4_mini_json": 'functools[{"name": "weather", "arguments": %s}, {"name": "time", "arguments": {}}]',
}
CONTENT = {"hermes": "Let me look.", "mistral": "Let me look.", "jamba": "Let me look."}
EXPECTED = [ParsedCall("weather", json.dumps(ARGS)), ParsedCall("time", "{}")]


def test_every_parser_has_an_example_output():
    assert set(OUTPUTS) == set(PARSERS)


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_parser_reads_calls_and_content(name):
    content, calls = PARSERS[name].extract(OUTPUTS[name] % json.dumps(ARGS))
    assert calls == EXPECTED
    assert content == CONTENT.get(name)


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_parser_leaves_plain_text_and_broken_calls_as_content(name):
    parser = PARSERS[name]
    assert parser.extract("The weather is fine.") == ("The weather is fine.", [])
    broken = OUTPUTS[name] % '{"city": "Par'
    assert parser.extract(broken) == (broken, [])


def test_llama3_json_bare_object_is_a_call():
    content, calls = PARSERS["llama3_json"].extract('  {"name": "time", "parameters": {"tz": "UTC"}}')
    assert calls == [ParsedCall("time", '{"tz": "UTC"}')] and content is None


def test_unknown_parser_name_is_refused_naming_the_known():
    with pytest.raises(ValueError, match="hermes"):
        tool_parser("nope")
    with pytest.raises(ValueError, match="tool_parser"):
        ServerSettings.from_cfg(None, tool_parser="nope")
    with pytest.raises(ValueError, match="json_max_whitespace"):
        ServerSettings.from_cfg(None, json_max_whitespace=0)
    assert ServerSettings.from_cfg(None, tool_parser=None, json_max_whitespace=None).tool_parser is None


@pytest.mark.parametrize("name", sorted(OUTPUTS))
@pytest.mark.parametrize("step", [1, 3, 7])
def test_streamed_reply_equals_whole_reply(name, step):
    reply = ToolReply("auto", PARSERS[name])
    text = OUTPUTS[name] % json.dumps(ARGS)
    whole, finish = reply.message(text, "stop")
    state = ToolDeltas(reply)
    content = "".join(state.add(text[i : i + step]) for i in range(0, len(text), step))
    last, streamed_finish = state.finish("stop")
    content += last.get("content", "")
    assert (content or None) == whole["content"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in last["tool_calls"]] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in whole["tool_calls"]
    ]
    assert [c["index"] for c in last["tool_calls"]] == [0, 1]
    assert finish == streamed_finish == "tool_calls"


def test_streamed_plain_text_holds_back_only_a_possible_marker():
    state = ToolDeltas(ToolReply("auto", PARSERS["hermes"]))
    assert state.add("Hello <tool") == "Hello "  # "<tool" may begin "<tool_call>"
    assert state.add("kit> done") == "<toolkit> done"
    last, finish = state.finish("stop")
    assert last == {} and finish == "stop"


def test_required_and_named_replies():
    calls = json.dumps([{"name": "weather", "parameters": ARGS}])
    message, finish = ToolReply("required", None).message(calls, "stop")
    assert finish == "tool_calls" and message["content"] is None
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == ARGS
    message, finish = ToolReply("named", None, "weather").message(json.dumps(ARGS), "stop")
    assert finish == "stop" and message["tool_calls"][0]["function"]["name"] == "weather"
    cut, finish = ToolReply("required", None).message('[{"name": "wea', "length")
    assert finish == "length" and cut["content"] == '[{"name": "wea' and "tool_calls" not in cut


def test_required_schema_follows_parallel_tool_calls():
    tools = [Tool.model_validate({"type": "function", "function": {"name": "f"}})]
    assert required_schema(tools)["minItems"] == 1 and "maxItems" not in required_schema(tools)
    assert required_schema(tools, parallel=False)["maxItems"] == 1


class _Tok:
    """A tokenizer whose template ignores tools (as SmolLM2's does)."""

    chat_template = "x"

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, tokenize=False, **kw):
        return "|".join(f"{m['role']}:{m['content']}" for m in messages)

    def encode(self, text, add_special_tokens=False):
        return [len(text)]


class _Model:
    name = "m"


def test_tools_are_stated_when_the_template_ignores_them():
    tools = [{"type": "function", "function": {"name": "weather"}}]
    msgs = [{"role": "user", "content": "hi"}]
    text = render_chat(_Tok(), _Model(), msgs, tools, parser=PARSERS["hermes"], state_tools=True)
    assert text.startswith("system:") and '"weather"' in text and "<tool_call>" in text
    assert render_chat(_Tok(), _Model(), msgs, tools, state_tools=False) == "user:hi"


def test_auto_tool_choice_needs_a_parser():
    req = P.ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [
            {"type": "function", "function": {"name": "weather"}}]}
    )  # fmt: skip
    with pytest.raises(P.APIError, match="tool_parser") as e:
        chat_prompt_ids(_Tok(), req, _Model(), None)
    assert e.value.param == "tool_choice"
    assert chat_prompt_ids(_Tok(), req, _Model(), PARSERS["hermes"])
