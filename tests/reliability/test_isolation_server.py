"""Per-request fault isolation through the HTTP server: a request that fails in the engine gets an error of
its own (not streaming: a 500 with an OpenAI-style body naming its error; streaming: an error event, then
[DONE]) while 20 requests served alongside it get exactly the completions they get alone; Prometheus counts
it under vllm:request_success{finished_reason="error"}; the engine is left with every block free. A failed
forward fails the requests of that step and the server serves the next ones."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from testbed import Engine
from testbed.config import EngineConfig
from testbed.server import ServerThread

from .poison import INJECTIONS, POISON_TOKEN, healthy_prompts

MODEL = "tiny"
MAX_TOKENS = 24  # long enough that the 22 requests are in flight together


@pytest.fixture(scope="module")
def server(one_torch_thread):
    engine = Engine(EngineConfig(model=MODEL, tokenizer="smollm2-135m", num_blocks=512, max_num_seqs=32))
    with ServerThread(engine) as srv:
        yield srv


def healthy_body(i: int, stream: bool) -> dict:
    """Greedy, greedy with a repetition penalty (logits processors), seeded sampling."""
    extra = [{"temperature": 0}, {"temperature": 0, "repetition_penalty": 1.3}, {"temperature": 0.9, "seed": 7}]
    prompt = healthy_prompts()[i]
    return {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream} | extra[
        i % 3
    ]


def send(url: str, body: dict) -> dict:
    """status, text, finish_reason, error (the error object, if any) and, streaming, whether [DONE] came last."""
    with httpx.Client(base_url=url, timeout=60) as client:
        if not body["stream"]:
            r = client.post("/v1/completions", json=body)
            data = r.json()
            if r.status_code != 200:
                return {"status": r.status_code, "error": data["error"]}
            choice = data["choices"][0]
            return {"status": 200, "text": choice["text"], "finish_reason": choice["finish_reason"], "error": None}
        result = {"text": "", "finish_reason": None, "error": None, "done_last": False}
        with client.stream("POST", "/v1/completions", json=body) as r:
            result["status"] = r.status_code
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                assert not result["done_last"], "an event after [DONE]"
                payload = line[len("data: ") :]
                if payload == "[DONE]":
                    result["done_last"] = True
                    continue
                chunk = json.loads(payload)
                if "error" in chunk:
                    result["error"] = chunk["error"]
                    continue
                choice = chunk["choices"][0]
                result["text"] += choice["text"]
                result["finish_reason"] = choice["finish_reason"] or result["finish_reason"]
        return result


def metric(scrape, url: str, reason: str) -> float:
    key = f'vllm:request_success_total{{engine="0",finished_reason="{reason}",model_name="{MODEL}"}}'
    return scrape(url).get(key, 0.0)


def assert_engine_clean(server, wait_for) -> None:
    assert wait_for(lambda: server.async_engine.num_in_flight == 0, 30)
    kv = server.engine.kv
    assert wait_for(lambda: kv.num_free_blocks == kv.num_blocks, 10)


def test_poisoned_request_gets_its_own_error(server, scrape, wait_for, monkeypatch):
    bodies = [healthy_body(i, stream=i % 2 == 0) for i in range(20)]
    alone = [send(server.url, b) for b in bodies]  # one at a time, before the poison
    assert all(r["status"] == 200 and r["finish_reason"] == "length" for r in alone)

    injection = INJECTIONS["processors"]
    injection.install(monkeypatch)
    poison = {"model": MODEL, "prompt": [POISON_TOKEN, 11, 12, 13], "max_tokens": MAX_TOKENS, "ignore_eos": True}
    poison |= {"temperature": 0, "repetition_penalty": 1.2}
    before = {reason: metric(scrape, server.url, reason) for reason in ("error", "length")}
    everything = bodies[:10] + [poison | {"stream": False}, poison | {"stream": True}] + bodies[10:]
    with ThreadPoolExecutor(len(everything)) as pool:
        results = list(pool.map(lambda b: send(server.url, b), everything))
    plain, streamed = results.pop(10), results.pop(10)

    assert plain["status"] == 500 and plain["error"]["type"] == "server_error"
    assert streamed["status"] == 200 and streamed["error"]["type"] == "server_error" and streamed["done_last"]
    assert streamed["finish_reason"] is None  # the error event is its end
    for r in (plain, streamed):
        message = r["error"]["message"]
        assert message.startswith("request ") and "sampling failed: RuntimeError: poisoned logits processor" in message
    assert injection.shared_a_batch()
    assert [(r["status"], r["finish_reason"], r["error"]) for r in results] == [(200, "length", None)] * 20
    assert [r["text"] for r in results] == [r["text"] for r in alone]
    assert all(r["done_last"] for r, b in zip(results, bodies) if b["stream"])

    assert metric(scrape, server.url, "error") - before["error"] == 2
    assert metric(scrape, server.url, "length") - before["length"] == 20
    assert_engine_clean(server, wait_for)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_forward_failure_errors_that_step_then_serves(server, scrape, wait_for, monkeypatch):
    """The forward fails twice: a streamed request, then one not streamed, each alone in its step."""
    model = server.engine.model
    forward = model.forward
    calls = []

    def failing_twice(*args, **kwargs):
        calls.append(None)
        if len(calls) <= 2:
            raise RuntimeError("injected forward failure")
        return forward(*args, **kwargs)

    errors_before = metric(scrape, server.url, "error")
    monkeypatch.setattr(model, "forward", failing_twice)
    streamed, plain = [send(server.url, healthy_body(i, stream)) for i, stream in ((0, True), (1, False))]
    assert streamed["status"] == 200 and streamed["done_last"] and streamed["text"] == ""
    assert plain["status"] == 500
    for r in (streamed, plain):
        assert r["error"]["type"] == "server_error"
        assert "failed: the engine step failed: RuntimeError: injected forward failure" in r["error"]["message"]
    served = send(server.url, healthy_body(2, stream=False))
    assert served["status"] == 200 and served["finish_reason"] == "length"
    assert metric(scrape, server.url, "error") - errors_before == 2
    assert_engine_clean(server, wait_for)
