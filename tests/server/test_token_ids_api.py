"""return_token_ids (vLLM's extension): the prompt's token ids as the engine saw them and each choice's
generated ids, in vLLM's places, whole and streamed; the streamed ids add up to the whole answer's."""

import json

import httpx
import pytest

from testbed import Engine
from testbed.config import EngineConfig
from testbed.server import ServerThread

MODEL = "smollm2-135m"  # a real vocabulary: text prompts and the chat template tokenize within it


@pytest.fixture(scope="module")
def server(one_torch_thread):
    config = EngineConfig(model=MODEL, kernel="torch", num_blocks=160, max_model_len=1024, max_num_seqs=8)
    with ServerThread(Engine(config)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def stream(client, path: str, body: dict) -> list[dict]:
    chunks = []
    with client.stream("POST", path, json=body | {"stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def test_completions_return_prompt_and_generated_ids(server, client):
    tok = server.engine.tokenizer
    body = {"model": MODEL, "prompt": "Hello there", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    plain = client.post("/v1/completions", json=body).json()["choices"][0]
    assert "token_ids" not in plain and "prompt_token_ids" not in plain  # only when asked
    whole = client.post("/v1/completions", json=body | {"return_token_ids": True}).json()
    choice = whole["choices"][0]
    assert choice["prompt_token_ids"] == tok.encode("Hello there")
    assert len(choice["token_ids"]) == whole["usage"]["completion_tokens"] == 6
    assert tok.decode(choice["token_ids"], skip_special_tokens=True) == choice["text"] == plain["text"]
    chunks = stream(client, "/v1/completions", body | {"return_token_ids": True})
    with_choice = [c["choices"][0] for c in chunks if c["choices"]]
    assert with_choice[0]["prompt_token_ids"] == choice["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in with_choice[1:])  # once, on the first chunk
    assert [t for c in with_choice for t in c["token_ids"]] == choice["token_ids"]
    # a token-id prompt comes back as sent: a client can extend the engine's exact history
    ids = choice["prompt_token_ids"] + choice["token_ids"] + [42]
    again = client.post("/v1/completions", json=body | {"prompt": ids, "return_token_ids": True}).json()
    assert again["choices"][0]["prompt_token_ids"] == ids


def test_chat_returns_prompt_ids_at_top_level_and_ids_per_choice(client):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0}
    body |= {"ignore_eos": True, "return_token_ids": True}
    whole = client.post("/v1/chat/completions", json=body).json()
    prompt_ids, choice = whole["prompt_token_ids"], whole["choices"][0]
    assert len(prompt_ids) == whole["usage"]["prompt_tokens"] and len(choice["token_ids"]) == 5
    chunks = stream(client, "/v1/chat/completions", body)
    assert chunks[0]["prompt_token_ids"] == prompt_ids
    assert [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids", [])] == choice["token_ids"]


def test_return_token_ids_must_be_a_bool(client):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "return_token_ids": "yes"}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400 and "return_token_ids" in r.text
