"""n and best_of over HTTP against a live smollm2-135m server (the official `openai` client): n choices,
whole and streamed with per-choice indices, choice i equal to the request with seed + i, best_of keeping the
most likely, usage over every choice, and vLLM's messages for bad values."""

import httpx
import openai
import pytest

from testbed import Engine
from testbed.config import EngineConfig
from testbed.server import ServerThread

MODEL = "smollm2-135m"
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def server(one_torch_thread):
    engine = Engine(EngineConfig(model=MODEL, num_blocks=160, max_model_len=1024, max_num_seqs=8))
    with ServerThread(engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def completion(client, **kw):
    # top_k: a sibling computes the prompt's last token in another batch shape than a lone request does, so
    # its logits differ in the last float bits; drawing from the whole 49k vocabulary, a seeded draw that
    # lands in the far tail (p ~ 1e-6) can then pick the neighbouring token. Among the top 20 it cannot.
    return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, extra_body={"top_k": 20}, **kw)


@pytest.fixture(scope="module")
def three(client):
    return completion(client, n=3, seed=5, logprobs=0)


def test_completion_n_choices_are_the_seeded_requests(client, three):
    assert [c.index for c in three.choices] == [0, 1, 2]
    for i, choice in enumerate(three.choices):
        single = completion(client, seed=5 + i, logprobs=0).choices[0]
        assert choice.text == single.text and choice.logprobs.tokens == single.logprobs.tokens
    assert three.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in three.choices)
    assert len({c.text for c in three.choices}) > 1


def test_completion_stream_per_choice(client, three):
    texts, finishes, usage = {}, {}, None
    for chunk in completion(client, n=3, seed=5, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason is not None:
                assert c.index not in finishes
                finishes[c.index] = c.finish_reason
    assert texts == {c.index: c.text for c in three.choices}
    assert finishes == {c.index: c.finish_reason for c in three.choices}
    assert usage.completion_tokens == three.usage.completion_tokens


def test_chat_n_whole_and_streamed(client):
    kw = dict(model=MODEL, messages=CHAT, max_tokens=5, seed=3, extra_body={"top_k": 20})
    whole = client.chat.completions.create(n=2, **kw)
    assert [c.index for c in whole.choices] == [0, 1]
    for i, choice in enumerate(whole.choices):
        single = client.chat.completions.create(**{**kw, "seed": 3 + i}).choices[0]
        assert choice.message.content == single.message.content
    roles, texts = {}, {}
    for chunk in client.chat.completions.create(n=2, stream=True, **kw):
        for c in chunk.choices:
            if c.delta.role:
                roles[c.index] = c.delta.role
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    assert roles == {0: "assistant", 1: "assistant"}
    assert texts == {c.index: c.message.content for c in whole.choices}


def test_best_of_returns_the_most_likely(client, three):
    best = completion(client, n=1, best_of=3, seed=5, logprobs=0)
    (choice,) = best.choices
    ranked = max(three.choices, key=lambda c: sum(c.logprobs.token_logprobs))
    assert choice.index == 0 and choice.text == ranked.text


def test_generation_tokens_count_every_choice(server, client, scrape, wait_for):
    assert wait_for(lambda: server.async_engine.num_in_flight == 0, timeout=30)
    before = scrape(server.url).get("vllm:generation_tokens_total", 0)
    r = completion(client, n=4, seed=9)
    assert wait_for(lambda: server.async_engine.num_in_flight == 0, timeout=30)
    assert scrape(server.url)["vllm:generation_tokens_total"] - before == r.usage.completion_tokens


@pytest.mark.parametrize(
    "body, param, message",
    [
        ({"n": 0}, "n", "n must be at least 1, got 0."),
        ({"n": 2, "temperature": 0}, "n", "n must be 1 when using greedy sampling, got 2."),
        ({"n": 9}, "n", "n=9 sequences cannot run together with max_num_seqs=8"),
        ({"n": 8, "max_tokens": 900}, "n", "n=8 sequences of up to"),
        ({"n": 2, "best_of": 1}, "best_of", "best_of must be greater than or equal to n, got n=2 and best_of=1."),
        ({"best_of": 2, "stream": True}, "best_of", "best_of=2 > n=1 cannot be streamed"),
        ({"n": "2"}, "n", None),
    ],
)
def test_bad_n_and_best_of(server, body, param, message):
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": PROMPT, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    if message is not None:
        assert message in err["message"]
