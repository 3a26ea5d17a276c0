"""The HTTP server against a hostile client: every bad input class gets a 4xx with an OpenAI-style body
(never a 500), limits are enforced before parsing or tokenizing, half-sent requests time out, tokenizing
happens off the event loop, and the server keeps serving everyone else throughout.

The tiny model (random weights, fast steps) carries the real SmolLM2 tokenizer, so text prompts and chat
messages take the real tokenizer and chat-template paths (their ids past the tiny vocabulary are a 400)."""

import json
import socket
import threading
import time

import httpx
import pytest

from testbed import Engine
from testbed.config import EngineConfig
from testbed.server import ServerThread
from testbed.server.tokenizer_pool import TokenizerPool

MODEL = "tiny"
LIMITS = {"max_body_bytes": 64 * 1024, "max_prompt_chars": 20_000, "header_timeout_s": 1.0, "body_timeout_s": 1.0}


@pytest.fixture(scope="module")
def server(one_torch_thread):
    engine = Engine(EngineConfig(model=MODEL, tokenizer="smollm2-135m", num_blocks=256, max_num_seqs=16))
    with ServerThread(engine, **LIMITS) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def post(client, body: bytes | str, path="/v1/completions"):
    return client.post(path, content=body, headers={"content-type": "application/json"})


def assert_openai_error(r, status: int, code: str | None = None):
    assert r.status_code == status, r.text[:300]
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


def raw_request(server, data: bytes, read_timeout: float = 10.0) -> tuple[bytes, float, bool]:
    """Send bytes on a fresh connection; (what came back, seconds until it came, whether the server closed)."""
    with socket.create_connection((server.host, server.port)) as s:
        s.settimeout(read_timeout)
        start = time.monotonic()
        s.sendall(data)
        got = s.recv(65536)
        elapsed = time.monotonic() - start
        closed = True
        try:
            while chunk := s.recv(65536):
                got += chunk
        except TimeoutError:
            closed = False
        return got, elapsed, closed


GOOD = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True}


# ---- sizes ----------------------------------------------------------------------------------------------
def test_body_over_limit_refused_from_its_content_length(server):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    got, elapsed, closed = raw_request(server, head + b"Content-Length: 104857600\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in got and closed
    assert elapsed < LIMITS["body_timeout_s"]  # answered at once, without waiting for the 100 MB


def test_chunked_body_over_limit_refused_while_arriving(client):
    def chunks():
        for _ in range(100):
            yield b"x" * 4096

    assert_openai_error(post(client, chunks()), 413, "request_too_large")


@pytest.mark.parametrize(
    "body, path",
    [
        ({**GOOD, "prompt": "word " * 5000}, "/v1/completions"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "word " * 2500}] * 2}, "/v1/chat/completions"),
    ],
    ids=["completion", "chat"],
)
def test_prompt_over_max_chars_refused_before_tokenizing(client, body, path):
    error = assert_openai_error(post(client, json.dumps(body), path), 400, "prompt_too_long")
    assert "max_prompt_chars" in error["message"]


# ---- malformed and hostile JSON -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        b"[" * 30_000 + b"]" * 30_000,
        b'{"model": "tiny", "prompt": [1], "user": ' + b"[" * 30_000 + b"]" * 30_000 + b"}",
        b'{"model": "tiny", "prompt": [1], "max_tokens": ' + b"9" * 5000 + b"}",
        b'{"model": "tiny", "prompt": "caf\xe9"}',  # latin-1, not UTF-8
        b'{"model": "tiny", "prompt": [1]',
    ],
    ids=["deep", "deep_field", "int_5000_digits", "not_utf8", "truncated"],
)
def test_malformed_json_is_400(client, body):
    assert_openai_error(post(client, body), 400, "invalid_json")


@pytest.mark.parametrize(
    "body, path, param",
    [
        ('{"model": "tiny\\ud800", "prompt": [1]}', "/v1/completions", "model"),
        ('{"model": "tiny", "prompt": "a\\udc00b"}', "/v1/completions", "prompt"),
        ('{"model": "tiny", "prompt": [1], "stop": ["\\ud83d"]}', "/v1/completions", "stop"),
        ('{"model": "tiny", "prompt": [1], "user": "\\udfff"}', "/v1/completions", "user"),
        ('{"model": "tiny", "prompt": [1], "\\ud800": 1}', "/v1/completions", None),
        (
            '{"model": "tiny", "messages": [{"role": "user", "content": "x\\ud800"}]}',
            "/v1/chat/completions",
            "messages",
        ),
    ],
    ids=["model", "prompt", "stop", "ignored_field", "key", "chat_content"],
)
def test_unpaired_surrogates_are_400(client, body, path, param):
    error = assert_openai_error(post(client, body, path), 400, "invalid_unicode")
    assert error["param"] == param


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", 10**300),
        ("temperature", 10**400),
        ("top_p", 10**400),
        ("seed", 10**30),
        ("priority", 10**30),
        ("n", 10**30),
        ("logprobs", 10**30),
        ("prompt", [10**30]),
        ("stop_token_ids", [1.5]),
        ("temperature", "0.5"),
    ],
)
def test_huge_or_mistyped_values_are_400(client, field, value):
    assert_openai_error(post(client, json.dumps({**GOOD, field: value})), 400)


# ---- half-sent requests ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data",
    [b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-"],
    ids=["silent", "half_head"],
)
def test_half_sent_head_times_out(server, client, data):
    got, elapsed, closed = raw_request(server, data)
    assert got.startswith(b"HTTP/1.1 408") and closed
    assert LIMITS["header_timeout_s"] * 0.9 <= elapsed < LIMITS["header_timeout_s"] + 5
    assert client.get("/health").status_code == 200


def test_half_sent_body_times_out(server):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    got, elapsed, closed = raw_request(server, head + b'{"model": "tiny", ')
    assert got.startswith(b"HTTP/1.1 408") and b"body_timeout_s" in got and closed
    assert LIMITS["body_timeout_s"] * 0.9 <= elapsed < LIMITS["body_timeout_s"] + 5


# ---- the others keep being served -----------------------------------------------------------------------
class BlockingTokenizer:
    """Encodes only when released, so a test can look at the server while a prompt is being tokenized."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()

    def encode(self, text, add_special_tokens=True):
        self.entered.set()
        assert self.release.wait(60)
        return [5, 6, 7]


def test_tokenizing_does_not_block_the_event_loop(server, client):
    model = server.server.config.app.state.model
    real, blocking = model.tokenizers, BlockingTokenizer()
    model.tokenizers = TokenizerPool(blocking, 2, copy=lambda tok: tok)
    try:
        slow = {}
        waiter = threading.Thread(target=lambda: slow.update(r=post(client, json.dumps({**GOOD, "prompt": "hi"}))))
        waiter.start()
        assert blocking.entered.wait(30)
        # while that prompt is being tokenized: health answers, and another request runs to completion
        start = time.monotonic()
        assert client.get("/health", timeout=5).status_code == 200
        other = post(client, json.dumps(GOOD))
        assert other.status_code == 200 and other.json()["usage"]["completion_tokens"] == 3
        assert time.monotonic() - start < 20 and waiter.is_alive()
        blocking.release.set()
        waiter.join(30)
        assert slow["r"].status_code == 200 and slow["r"].json()["usage"]["prompt_tokens"] == 3
    finally:
        blocking.release.set()
        model.tokenizers.shutdown()
        model.tokenizers = real


def test_tiny_temperature_among_healthy_streams(server, client):
    """The poisoned request of issue 13 over HTTP: temperature 1e-39 (raised to 0.01) beside 20 healthy
    greedy requests, streamed and not: all complete, the greedy ones with the tokens they get alone."""
    prompts = [[5 + i, 17, 300 + 7 * i] for i in range(20)]
    body = {"model": MODEL, "max_tokens": 5, "ignore_eos": True, "temperature": 0}
    alone = [post(client, json.dumps({**body, "prompt": p})).json()["choices"][0]["text"] for p in prompts]
    results: dict = {}

    def send(i, payload, stream):
        with httpx.Client(base_url=server.url, timeout=60) as c:
            if stream:
                with c.stream("POST", "/v1/completions", json={**payload, "stream": True}) as r:
                    lines = [line for line in r.iter_lines() if line.startswith("data: ")]
                    chunks = [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]
                    results[i] = (r.status_code, "".join(ch["choices"][0]["text"] for ch in chunks), lines[-1])
            else:
                r = c.post("/v1/completions", json=payload)
                results[i] = (r.status_code, r.json()["choices"][0]["text"], "data: [DONE]")

    threads = [
        threading.Thread(target=send, args=(i, {**body, "prompt": p}, i % 2 == 0)) for i, p in enumerate(prompts)
    ]
    poison = threading.Thread(target=send, args=("poison", {**body, "prompt": [9, 9], "temperature": 1e-39}, True))
    for t in [*threads[:10], poison, *threads[10:]]:
        t.start()
    for t in [*threads, poison]:
        t.join(120)
    assert results["poison"][0] == 200 and results["poison"][2] == "data: [DONE]"
    assert [results[i] for i in range(20)] == [(200, text, "data: [DONE]") for text in alone]


def test_still_serving_and_no_block_leaked(server, client):
    r = post(client, json.dumps(GOOD))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    engine = server.engine
    deadline = time.monotonic() + 30
    while server.async_engine.num_in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.kv.pool.num_free_blocks == engine.kv.num_blocks
    engine.kv.pool.check_invariants()
