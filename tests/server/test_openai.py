"""The OpenAI-compatible API against a live server on loopback, through the official `openai` client.

Real text needs a tokenizer, so this module serves the built-in smollm2-135m (context cut to 2048 to
keep the KV cache small). Generations are short: a CPU step of this model is ~0.1-0.3 s here.
"""

import json

import httpx
import openai
import pytest

from testbed import Engine
from testbed.config import EngineConfig
from testbed.server import ServerThread

MODEL = "smollm2-135m"
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def server(one_torch_thread):
    engine = Engine(EngineConfig(model=MODEL, num_blocks=160, max_model_len=2048, max_num_seqs=8))
    with ServerThread(engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def greedy_completion(client):
    return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)


def test_models_and_health(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok"


def test_completion_usage(server, greedy_completion):
    c = greedy_completion
    assert c.object == "text_completion" and c.model == MODEL
    choice = c.choices[0]
    assert choice.text.strip() and choice.finish_reason in ("stop", "length")
    n_prompt = len(server.engine.tokenizer.encode(PROMPT))
    assert c.usage.prompt_tokens == n_prompt
    assert 1 <= c.usage.completion_tokens <= 12
    assert c.usage.total_tokens == n_prompt + c.usage.completion_tokens
    if choice.finish_reason == "length":
        assert c.usage.completion_tokens == 12


def test_completion_stream_reassembles(client, greedy_completion):
    stream = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == greedy_completion.choices[0].text
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == greedy_completion.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == greedy_completion.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == greedy_completion.usage.prompt_tokens


def test_stop_string_streamed_and_whole(client, greedy_completion):
    full = greedy_completion.choices[0].text
    words = full.split()
    if len(words) < 3:
        pytest.skip(f"greedy text too short to pick a stop string: {full!r}")
    stop = " " + words[2]
    expected = full[: full.index(stop)]
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop])
    assert whole.choices[0].text == expected and whole.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=stop, stream=True
    )
    assert "".join(ch.choices[0].text for ch in streamed) == expected


def test_chat_whole_and_streamed(server, client):
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, temperature=0)
    msg = whole.choices[0].message
    assert whole.object == "chat.completion" and msg.role == "assistant" and msg.content.strip()
    tok = server.engine.tokenizer
    n_prompt = len(
        tok.encode(tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False), add_special_tokens=False)
    )
    assert whole.usage.prompt_tokens == n_prompt
    assert whole.usage.total_tokens == n_prompt + whole.usage.completion_tokens
    stream = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=10, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == msg.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)


def test_logprobs_and_seed(client):
    c = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1, extra_body={"ignore_eos": True}
    )
    lp = c.choices[0].logprobs
    assert c.usage.completion_tokens == 4 and len(lp.token_logprobs) == 4 and len(lp.tokens) == 4
    assert all(v <= 0 for v in lp.token_logprobs)
    chat = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=3, temperature=0, logprobs=True, extra_body={"ignore_eos": True}
    )
    assert len(chat.choices[0].logprobs.content) == 3
    # same seed, same sample; top_k as an extension
    a, b = (
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=7, extra_body={"top_k": 50}
        )
        for _ in range(2)
    )
    assert a.choices[0].text == b.choices[0].text


# ---- bad input: an OpenAI-style error body, 400 (404 for unknown routes/models), never 500 ------------------
LONG = "hello " * 2100  # > 2048 tokens


@pytest.mark.parametrize(
    "kwargs, status, param",
    [
        (dict(model="no-such-model", prompt=PROMPT), 404, "model"),
        (dict(model=MODEL, prompt=LONG, max_tokens=4), 400, "prompt"),
        (dict(model=MODEL, prompt=PROMPT, max_tokens=2047), 400, "max_tokens"),
        (dict(model=MODEL, prompt=PROMPT, max_tokens=0), 400, "max_tokens"),
        (dict(model=MODEL, prompt=PROMPT, max_tokens=-3), 400, "max_tokens"),
        (dict(model=MODEL, prompt=PROMPT, temperature=-0.5), 400, "temperature"),
        (dict(model=MODEL, prompt=PROMPT, top_p=0), 400, "top_p"),
        (dict(model=MODEL, prompt=PROMPT, top_p=1.5), 400, "top_p"),
        (dict(model=MODEL, prompt=PROMPT, n=0), 400, "n"),
        (dict(model=MODEL, prompt=PROMPT, temperature="hot"), 400, "temperature"),
        (dict(model=MODEL, prompt=PROMPT, max_tokens="ten"), 400, "max_tokens"),
        (dict(model=MODEL, prompt=PROMPT, max_tokens=2.5), 400, "max_tokens"),
        (dict(model=MODEL, prompt=123), 400, "prompt"),
        (dict(model=MODEL, prompt=[]), 400, "prompt"),
        (dict(model=MODEL, prompt=[10**9]), 400, "prompt"),
        (dict(model=MODEL, prompt=PROMPT, stop=5), 400, "stop"),
        (dict(model=MODEL, prompt=PROMPT, seed="x"), 400, "seed"),
        (dict(model=MODEL, prompt=PROMPT, seed=2**70), 400, "seed"),
        (dict(model=MODEL, prompt=PROMPT, logprobs=-1), 400, "logprobs"),
        (dict(model=MODEL, prompt=PROMPT, stream="yes"), 400, "stream"),
        (dict(model=MODEL, prompt=PROMPT, extra_body={"top_k": "many"}), 400, "top_k"),
        (dict(model=MODEL, prompt=PROMPT, extra_body={"ignore_eos": "yes"}), 400, "ignore_eos"),
    ],
)
def test_completion_bad_input(client, kwargs, status, param):
    for stream in (False, True):
        if stream and "stream" in kwargs:
            continue
        with pytest.raises(openai.APIStatusError) as info:
            client.completions.create(**kwargs, **({"stream": True} if stream else {}))
        err = info.value
        assert err.status_code == status, err.response.text
        body = err.response.json()["error"]
        assert body["message"] and body["type"]
        if param is not None:
            assert body["param"] == param, body


@pytest.mark.parametrize(
    "kwargs, status",
    [
        (dict(model="gpt-4o", messages=CHAT), 404),
        (dict(model=MODEL, messages=[]), 400),
        (dict(model=MODEL, messages="hello"), 400),
        (dict(model=MODEL, messages=[{"role": "wizard", "content": "hi"}]), 400),
        (dict(model=MODEL, messages=[{"content": "hi"}]), 400),
        (dict(model=MODEL, messages=CHAT, max_tokens=0), 400),
        (dict(model=MODEL, messages=CHAT, temperature=-1), 400),
        (dict(model=MODEL, messages=CHAT, top_p=2), 400),
        (dict(model=MODEL, messages=CHAT, n=3), 400),
        (dict(model=MODEL, messages=[{"role": "user", "content": LONG}]), 400),
    ],
)
def test_chat_bad_input(client, kwargs, status):
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**kwargs)
    assert info.value.status_code == status, info.value.response.text
    assert info.value.response.json()["error"]["message"]


def test_missing_fields_malformed_json_unknown_routes(server, client):
    # the client's raw POST: bodies its typed methods refuse to build
    for path, body in [
        ("/completions", {"model": MODEL}),
        ("/completions", {"prompt": PROMPT}),
        ("/chat/completions", {"model": MODEL}),
        ("/completions", {}),
    ]:
        with pytest.raises(openai.BadRequestError) as info:
            client.post(path, body=body, cast_to=object)
        assert "required" in info.value.response.json()["error"]["message"].lower()
    with pytest.raises(openai.NotFoundError):
        client.post("/no/such/route", body={}, cast_to=object)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    # what no client would send
    truncated = json.dumps({"model": MODEL, "prompt": PROMPT})[:-3].encode()
    non_finite = b'{"model": "%s", "prompt": "x", "temperature": Infinity}' % MODEL.encode()
    for raw in [b"{not json", b"", b"[1, 2]", b"\xff\xfe", truncated, non_finite]:
        r = httpx.post(server.url + "/v1/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["message"], (raw, r.text)
    r = httpx.get(server.url + "/v2/anything")
    assert r.status_code == 404 and r.json()["error"]["message"]


def test_no_request_left_behind(server, wait_for):
    """After all of the above (including every rejected request), nothing is stuck in the engine."""
    ae, engine = server.async_engine, server.engine
    assert wait_for(lambda: ae.num_in_flight == 0, timeout=30)
    assert wait_for(lambda: engine.kv.pool.num_free_blocks == engine.kv.num_blocks, timeout=10)
    assert ae.is_alive and ae.last_error is None
