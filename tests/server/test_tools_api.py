"""Tool calling and JSON output through the official openai client against a live server on loopback (the
built-in smollm2-135m; its chat template ignores tools, so the server states them in a system message)."""

import json

import httpx
import openai
import pytest
from pydantic import BaseModel

from testbed import Engine
from testbed.config import EngineConfig
from testbed.server import ServerThread

MODEL = "smollm2-135m"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class GetWeather(BaseModel):
    city: str
    days: int


class Person(BaseModel):
    name: str
    age: int
    city: str


TOOLS = [openai.pydantic_function_tool(GetWeather, description="The weather forecast for a city.")]
NAMED = {"type": "function", "function": {"name": "GetWeather"}}
# a hermes-format call the output is forced into (tool_choice auto + a regex), so the parser is tested end to end
HERMES_CALL = '<tool_call>{"name": "GetWeather", "arguments": {"city": "Paris", "days": 2}}</tool_call>'


@pytest.fixture(scope="module")
def server(one_torch_thread):
    engine = Engine(EngineConfig(model=MODEL, num_blocks=400, max_model_len=1024, max_num_seqs=10))
    with ServerThread(engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


# parallel_tool_calls false: with any number of calls allowed, SmolLM2 repeats its call until max_tokens
ONE_CALL = dict(tool_choice="required", parallel_tool_calls=False)


def test_required_tool_choice_gives_valid_calls(client):
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=100, temperature=0, **ONE_CALL
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice.message.content
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name == "GetWeather"
        GetWeather.model_validate_json(call.function.arguments)


def test_named_tool_choice_through_parse(client):
    r = client.chat.completions.parse(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=100, temperature=0
    )
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "GetWeather" and isinstance(call.function.parsed_arguments, GetWeather)
    assert r.choices[0].finish_reason == "stop"  # OpenAI's (and vLLM's) answer for a named function


def test_streamed_tool_calls_equal_the_whole_reply(client):
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=100, temperature=0, **ONE_CALL)
    whole = client.chat.completions.create(**kwargs).choices[0]
    calls, finish = {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert [calls[i] for i in sorted(calls)] == [
        {"name": t.function.name, "arguments": t.function.arguments} for t in whole.message.tool_calls
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_choice_parses_the_hermes_format(client, stream):
    forced = {"structured_outputs": {"regex": "Checking\\. " + HERMES_CALL.replace("{", "\\{").replace("}", "\\}")}}
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=80, temperature=0, extra_body=forced)
    if not stream:
        r = client.chat.completions.create(**kwargs).choices[0]
        content, calls, finish = r.message.content, r.message.tool_calls, r.finish_reason
        args = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
    else:
        content, args, finish = "", [], None
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for c in chunk.choices:
                content += c.delta.content or ""
                args += [(d.function.name, json.loads(d.function.arguments)) for d in c.delta.tool_calls or []]
                finish = c.finish_reason or finish
    assert content == "Checking. " and finish == "tool_calls"
    assert args == [("GetWeather", {"city": "Paris", "days": 2})]


def test_tool_results_round_trip(client):
    first = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=60, temperature=0
    ).choices[0]
    call = first.message.tool_calls[0]
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")


# the first three ran to max_tokens in newlines with whitespace unbounded (json_max_whitespace=null)
PARSE_PROMPTS = ["Give me a person from history.", "Name a famous musician.", "Who wrote Hamlet?",
                 "Invent a person.", "Describe a fictional character.", "Tell me about a friend.",
                 "Make up a customer record.", "Describe a famous painter.", "Describe a teacher.",
                 "Describe a chef."]  # fmt: skip
SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "Person", "schema": Person.model_json_schema(), "strict": True},
}


def _replies(client, prompts, **kwargs):
    from concurrent.futures import ThreadPoolExecutor

    def one(prompt):
        messages = [{"role": "user", "content": prompt}]
        if "response_format" in kwargs:
            return client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=200, temperature=0, **kwargs
            )
        return client.chat.completions.parse(
            model=MODEL, messages=messages, response_format=Person, max_tokens=200, temperature=0
        )

    with ThreadPoolExecutor(len(prompts)) as pool:  # together: the engine batches them
        return list(pool.map(one, prompts))


def _parse_all(client, prompts):
    for r in _replies(client, prompts):
        assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens <= 200
        assert isinstance(r.choices[0].message.parsed, Person)


def test_parse_json_ends_within_200_tokens(client):
    _parse_all(client, PARSE_PROMPTS[:2])


@pytest.mark.slow
def test_parse_json_ends_within_200_tokens_ten_prompts(client):
    _parse_all(client, PARSE_PROMPTS)


@pytest.mark.slow
def test_unbounded_whitespace_runs_to_max_tokens(one_torch_thread):
    """The bound is what makes the answers end: without it the same prompts write newlines until max_tokens."""
    engine = Engine(EngineConfig(model=MODEL, num_blocks=200, max_model_len=1024, max_num_seqs=4))
    with ServerThread(engine, json_max_whitespace=None) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        replies = _replies(c, PARSE_PROMPTS[:3], response_format=SCHEMA)
    for r in replies:
        assert r.choices[0].finish_reason == "length" and r.choices[0].message.content.count("\n") > 100


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [TOOL, TOOL]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}],
          "tool_choice": "required"}, "tool_choice"),
        ({"tools": [TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
          "function": {"name": "f", "arguments": "{not json"}}]}]}, "messages"),
    ],
)  # fmt: skip
def test_tool_fields_refused_with_openai_error(server, extra, param):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if err["param"] is not None or param in ("tools", "tool_choice", "messages"):
        assert err["param"] == param, err
