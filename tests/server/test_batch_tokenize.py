"""/v1/completions with a list of prompts, /tokenize, /detokenize and /version, against a live server on
loopback (the built-in smollm2-135m, through the official openai client and httpx)."""

import httpx
import openai
import pytest

from testbed import Engine
from testbed.config import EngineConfig
from testbed.server import ServerThread

MODEL = "smollm2-135m"
PROMPTS = ["The capital of France is", "1, 2, 3,", "Once upon a time"]


@pytest.fixture(scope="module")
def server(one_torch_thread):
    engine = Engine(EngineConfig(model=MODEL, num_blocks=160, max_model_len=512, max_num_seqs=8))
    with ServerThread(engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def singles(client):
    return [
        client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0, logprobs=2, echo=True)
        for p in PROMPTS
    ]


def test_batch_matches_one_prompt_at_a_time(server, client, singles):
    steps = server.engine.step_count
    batch = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=6, temperature=0, logprobs=2, echo=True)
    assert server.engine.step_count - steps < 3 * 6  # the prompts ran in shared steps
    assert [c.index for c in batch.choices] == [0, 1, 2]
    for one, c in zip(singles, batch.choices):
        assert c.text == one.choices[0].text and c.finish_reason == one.choices[0].finish_reason
        assert c.logprobs.tokens == one.choices[0].logprobs.tokens
        ref = one.choices[0].logprobs.token_logprobs
        assert c.logprobs.token_logprobs[0] is None and ref[0] is None
        assert c.logprobs.token_logprobs[1:] == pytest.approx(ref[1:], abs=1e-4)
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert batch.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)


def test_token_id_prompts_with_n_indexed_prompt_times_n(server, client):
    tok = server.engine.tokenizer
    ids = [tok.encode(p) for p in PROMPTS[:2]]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0.8, seed=7, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    alone = client.completions.create(model=MODEL, prompt=ids[1], max_tokens=4, temperature=0.8, seed=7, n=2)
    assert [c.text for c in r.choices[2:]] == [c.text for c in alone.choices]  # seeded: prompt 1's choices


def test_batch_stream_reassembles_per_choice(client, singles):
    stream = client.completions.create(
        model=MODEL, prompt=PROMPTS, max_tokens=6, temperature=0, echo=True, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    texts, finishes, usage = {}, {}, None
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert [texts[i] for i in range(3)] == [s.choices[0].text for s in singles]
    assert len(finishes) == 3
    assert usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)


def test_bad_prompt_fails_the_call_before_any_runs(server):
    finished = server.async_engine.num_finished
    body = {"model": MODEL, "prompt": ["fine", "x " * 600], "max_tokens": 4}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["message"].startswith("prompt 1:")
    for bad, param in [([], "prompt"), ([[1, 2], []], "prompt"), (["a", [1]], "prompt")]:
        r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": bad}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, bad
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": [[1], [10**9]]}, timeout=60)
    assert r.status_code == 400
    assert server.async_engine.num_finished == finished and server.async_engine.num_in_flight == 0


def test_tokenize_and_detokenize(server):
    tok, url = server.engine.tokenizer, server.url
    r = httpx.post(url + "/tokenize", json={"model": MODEL, "prompt": "Hello world", "return_token_strs": True}).json()
    assert r["tokens"] == tok.encode("Hello world") and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == 512 and r["token_strs"] == tok.convert_ids_to_tokens(r["tokens"])
    plain = httpx.post(url + "/tokenize", json={"prompt": "Hello", "add_special_tokens": False}).json()
    assert plain["tokens"] == tok.encode("Hello", add_special_tokens=False) and plain["token_strs"] is None
    messages = [{"role": "user", "content": "Hi there"}]
    chat = httpx.post(url + "/tokenize", json={"messages": messages}).json()
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert chat["tokens"] == tok.encode(text, add_special_tokens=False)
    back = httpx.post(url + "/detokenize", json={"model": MODEL, "tokens": r["tokens"]}).json()
    assert back == {"prompt": "Hello world"}
    assert httpx.get(url + "/version").json()["version"]


@pytest.mark.parametrize(
    "path, body, status, param",
    [
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {"prompt": "a", "return_token_strs": "yes"}, 400, "return_token_strs"),
        ("/tokenize", {"prompt": "a", "model": "other"}, 404, "model"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"messages": [{"role": "user", "content": "a"}], "continue_final_message": True}, 400, None),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
        ("/detokenize", {"tokens": "12"}, 400, "tokens"),
    ],
)
def test_tokenizer_routes_refuse_bad_bodies(server, path, body, status, param):
    r = httpx.post(server.url + path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param is not None:
        assert err["param"] == param
