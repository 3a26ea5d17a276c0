"""Load and admission control on the tiny model (random weights, token-id prompts, fast steps).

64 concurrent streams of mixed lengths, a quarter of whose clients hang up midway: every stream ends
correctly, the hung-up requests are aborted, and afterwards every KV block is free and /metrics shows
nothing running. Plus: 503 when the waiting queue is full, 401 without the API key, and a
non-streaming client that disconnects gets its request aborted.
"""

import asyncio
import json
import random
import threading

import httpx
import openai
import pytest

from testbed import Engine
from testbed.config import EngineConfig
from testbed.server import ServerThread

MODEL = "tiny"


def tiny_engine(**kwargs) -> Engine:
    kwargs.setdefault("num_blocks", 4096)
    return Engine(EngineConfig(model=MODEL, **kwargs))


@pytest.fixture(scope="module")
def server(one_torch_thread):
    with ServerThread(tiny_engine(max_num_batched_tokens=2048, max_num_seqs=64)) as srv:
        yield srv


async def _client_run(client, i: int, prompt: list[int], max_tokens: int, hang_up_after: int | None) -> dict:
    stream = await client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True},
    )
    chunks, finish, usage = 0, None, None
    async for chunk in stream:
        if chunk.choices:
            chunks += 1
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
        if hang_up_after is not None and chunks >= hang_up_after:
            await stream.close()  # drops the connection mid-stream
            break
    return {
        "i": i,
        "chunks": chunks,
        "finish": finish,
        "usage": usage,
        "max_tokens": max_tokens,
        "hung_up": hang_up_after is not None,
    }


def test_64_concurrent_streams_with_disconnects(server, scrape, wait_for):
    rng = random.Random(0)
    jobs = []
    for i in range(64):
        prompt = [rng.randrange(100, 4000) for _ in range(rng.choice([8, 40, 150, 400]))]
        if i % 4 == 3:  # hangs up after 3 chunks of a long generation: must be aborted, not finished
            jobs.append((i, prompt, 1000, 3))
        else:
            jobs.append((i, prompt, rng.randint(4, 48), None))

    async def main():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
            return await asyncio.gather(*[_client_run(client, *job) for job in jobs])

    before = scrape(server.url)
    results = asyncio.run(main())

    for r in results:
        if r["hung_up"]:
            assert r["chunks"] == 3 and r["finish"] is None
        else:  # a token per chunk, the exact count, finished by length (EOS ignored)
            assert r["finish"] == "length", r
            assert r["usage"].completion_tokens == r["max_tokens"] == r["chunks"], r

    engine, ae = server.engine, server.async_engine

    def idle_metrics():
        m = scrape(server.url)
        return m if m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0 else None

    m = wait_for(idle_metrics, timeout=30)
    assert m, "requests still running after every client is gone"
    assert m["vllm:kv_cache_usage_perc"] == 0.0
    assert m["testbed:kv_cache_free_blocks"] == m["testbed:kv_cache_num_blocks"] == engine.kv.num_blocks
    assert wait_for(lambda: ae.num_in_flight == 0, timeout=5)
    assert engine.kv.pool.num_free_blocks == engine.kv.num_blocks
    assert not engine.has_unfinished()

    def delta(key):
        return m[key] - before.get(key, 0.0)

    n_hung = sum(r["hung_up"] for r in results)
    assert delta('vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"}') == n_hung
    assert delta('vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"}') == 64 - n_hung
    finished_tokens = sum(r["max_tokens"] for r in results if not r["hung_up"])
    assert delta("vllm:generation_tokens_total") >= finished_tokens + 3 * n_hung
    assert delta("vllm:time_to_first_token_seconds_count") == 64
    assert delta("vllm:e2e_request_latency_seconds_count") == 64 - n_hung
    assert delta("vllm:prompt_tokens_total") == sum(len(job[1]) for job in jobs)
    # the hung-up ones were stopped early, far from their 1000 tokens
    assert delta("vllm:generation_tokens_total") < finished_tokens + 1000 * n_hung / 2


def test_non_streaming_client_disconnect_aborts(server, scrape, wait_for):
    before = scrape(server.url)['vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"}']
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            server.url + "/v1/completions",
            timeout=1.0,
            json={"model": MODEL, "prompt": [5] * 20, "max_tokens": 60000, "ignore_eos": True},
        )
    key = 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"}'
    assert wait_for(lambda: scrape(server.url)[key] == before + 1, timeout=20)
    assert wait_for(lambda: server.engine.kv.pool.num_free_blocks == server.engine.kv.num_blocks, timeout=10)


def test_waiting_queue_full_is_503(one_torch_thread, scrape, wait_for):
    # one running slot, two waiting places: the fourth concurrent request is refused
    with ServerThread(tiny_engine(num_blocks=512, max_num_seqs=1), max_waiting=2) as srv:
        body = {"model": MODEL, "prompt": [7] * 16, "max_tokens": 8000, "ignore_eos": True, "stream": True}
        clients, responses, stop = [], [], threading.Event()

        def hold(i):
            with httpx.Client(timeout=60) as c, c.stream("POST", srv.url + "/v1/completions", json=body) as r:
                responses.append(r.status_code)
                for _ in r.iter_lines():
                    if stop.is_set():
                        break

        for i in range(3):
            t = threading.Thread(target=hold, args=(i,), daemon=True)
            t.start()
            clients.append(t)
            if i == 0:
                assert wait_for(lambda: scrape(srv.url)["vllm:num_requests_running"] == 1, timeout=20)
        assert wait_for(lambda: scrape(srv.url)["vllm:num_requests_waiting"] == 2, timeout=20)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:
            client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=2)
        assert info.value.status_code == 503
        assert info.value.response.json()["error"]["code"] == "queue_full"
        assert info.value.response.headers.get("retry-after") == "1"
        assert scrape(srv.url)['testbed:request_rejected_total{engine="0",model_name="tiny",reason="queue_full"}'] == 1
        stop.set()
        for t in clients:
            t.join(30)
        assert responses == [200, 200, 200]
        engine = srv.engine
        assert wait_for(
            lambda: engine.kv.pool.num_free_blocks == engine.kv.num_blocks and srv.async_engine.num_in_flight == 0,
            timeout=20,
        )
        # room again
        assert client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=2).usage.completion_tokens == 2


def test_api_key(one_torch_thread):
    with ServerThread(tiny_engine(num_blocks=256), api_key="s3cret") as srv:
        for key in ("wrong", "s3cret-not"):
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0)
            with pytest.raises(openai.AuthenticationError) as info:
                client.completions.create(model=MODEL, prompt=[1, 2], max_tokens=2)
            assert info.value.status_code == 401 and info.value.response.json()["error"]["code"] == "invalid_api_key"
            with pytest.raises(openai.AuthenticationError):
                client.models.list()
        # no Authorization header at all, or another scheme
        for headers in ({}, {"Authorization": "s3cret"}, {"Authorization": "Basic s3cret"}):
            r = httpx.post(
                srv.url + "/v1/completions", json={"model": MODEL, "prompt": [1], "max_tokens": 1}, headers=headers
            )
            assert r.status_code == 401 and r.json()["error"]["message"], headers
        ok = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0)
        assert ok.completions.create(model=MODEL, prompt=[1, 2], max_tokens=2).usage.completion_tokens == 2
        assert [m.id for m in ok.models.list().data] == [MODEL]
        # health and metrics stay open (probes, scrapers)
        assert httpx.get(srv.url + "/health").status_code == 200
        assert httpx.get(srv.url + "/metrics").status_code == 200


def test_shutdown_drains_then_aborts(one_torch_thread, wait_for):
    """SIGTERM-equivalent stop: a stream still running after the grace period ends with finish_reason
    "abort" and [DONE] (not a cut connection); new requests are refused meanwhile."""
    srv = ServerThread(tiny_engine(num_blocks=1024), graceful_timeout_s=1.0).start()
    body = {"model": MODEL, "prompt": [9] * 8, "max_tokens": 16000, "ignore_eos": True, "stream": True}
    events, stopper = [], None
    with httpx.Client(timeout=60) as client, client.stream("POST", srv.url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 2:
                stopper = threading.Thread(target=srv.stop, daemon=True)
                stopper.start()
                assert wait_for(lambda: srv.async_engine.draining, timeout=10)
                refused = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
                with pytest.raises((openai.APIStatusError, openai.APIConnectionError)) as info:
                    refused.completions.create(model=MODEL, prompt=[1, 2], max_tokens=2)
                if isinstance(info.value, openai.APIStatusError):
                    assert info.value.status_code == 503
    stopper.join(30)
    assert not stopper.is_alive()
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "abort"
    assert 2 <= len(events) - 1 < 16000
    engine = srv.engine
    assert engine.kv.pool.num_free_blocks == engine.kv.num_blocks and not engine.has_unfinished()
    assert not srv.async_engine.is_alive


def test_engine_failure_fails_requests_not_the_server(one_torch_thread, wait_for):
    """A step that raises ends the in-flight requests with an error (500 / an error event), frees their
    blocks, and the server keeps serving."""
    engine = tiny_engine(num_blocks=512)
    real_step, armed = engine.step, threading.Event()

    def step():
        if armed.is_set() and engine.scheduler.num_running:
            armed.clear()
            raise RuntimeError("injected failure")
        return real_step()

    engine.step = step
    with ServerThread(engine) as srv:
        body = {"model": MODEL, "prompt": [4] * 8, "max_tokens": 5000, "ignore_eos": True, "stream": True}
        events = []
        with httpx.Client(timeout=60) as client, client.stream("POST", srv.url + "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 2:
                        armed.set()
        assert events[-1] == "[DONE]"
        assert "injected failure" in json.loads(events[-2])["error"]["message"]
        armed.set()
        r = httpx.post(srv.url + "/v1/completions", json={**body, "stream": False}, timeout=60)
        assert r.status_code == 500 and "injected failure" in r.json()["error"]["message"]
        assert wait_for(
            lambda: engine.kv.pool.num_free_blocks == engine.kv.num_blocks and srv.async_engine.num_in_flight == 0,
            timeout=10,
        )
        ok = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": [1, 2], "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
        assert httpx.get(srv.url + "/health").json()["status"] == "ok"


def test_fuzzed_bodies_never_500(server):
    """Random field/value mixes: 200 or an OpenAI-style 400/404, never a 500, nothing left running."""
    rng = random.Random(1)
    values = [
        None,
        True,
        False,
        0,
        1,
        -1,
        2,
        0.5,
        -0.5,
        1.5,
        1e9,
        "",
        "x",
        "1",
        [],
        [1],
        [1, 2, 3],
        ["a"],
        [[1]],
        {},
        {"a": 1},
        2**70,
        [-1],
        [True],
        [None],
    ]
    keys = [
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "n",
        "stop",
        "seed",
        "logprobs",
        "stream",
        "ignore_eos",
        "stop_token_ids",
        "stream_options",
        "echo",
        "best_of",
        "suffix",
        "presence_penalty",
        "priority",
        "logit_bias",
        "messages",
        "max_completion_tokens",
        "top_logprobs",
        "tools",
        "frequency_penalty",
        "repetition_penalty",
        "min_tokens",
        "bad_words",
        "allowed_token_ids",
        "prompt_logprobs",
        "response_format",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    ]
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for _ in range(80):
            body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}
            for _ in range(rng.randint(1, 3)):
                body[rng.choice(keys)] = rng.choice(values)
            path = rng.choice(["/v1/completions", "/v1/chat/completions"])
            r = c.post(path, json=body)
            assert r.status_code in (200, 400, 404), (body, r.text)
            if r.status_code != 200:
                assert r.json()["error"]["message"], body
    assert server.async_engine.last_error is None
