"""The router checks what it relays. With a good backend beside one that answers garbage, HTML 500 pages,
non-OpenAI JSON, or resets the connection, every client gets a well-formed answer (retried on the good
backend: nothing was relayed yet) and the bad backend is marked unhealthy; a stream cut without [DONE] ends
with an error event naming the backend; alone, a bad backend's answer becomes a 502 naming it."""

import json
import time

import httpx
import pytest

from testbed.cluster.http import RouterThread

from .fake_backends import FakeBackend

CLUSTER = {"router": "round_robin", "probe_interval_s": 0.2, "unhealthy_after": 2, "failure_window_s": 30.0}


def body(stream: bool) -> dict:
    return {"model": "m", "prompt": "hi", "max_tokens": 2, "stream": stream}


def exchange(client: httpx.Client, stream: bool) -> tuple[int, object]:
    """(status, parsed answer): a dict for JSON, the list of parsed events (and "[DONE]") for a stream."""
    if not stream:
        r = client.post("/v1/completions", json=body(False))
        return r.status_code, r.json()  # always JSON: anything else raises here
    with client.stream("POST", "/v1/completions", json=body(True)) as r:
        text = r.read().decode()
    if r.status_code != 200:
        return r.status_code, json.loads(text)
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert all(line.startswith("data: ") for line in text.splitlines() if line), text  # only SSE reaches the client
    return 200, [e if e == "[DONE]" else json.loads(e) for e in events]


@pytest.mark.parametrize("mode", ["garbage", "html500", "not_openai", "reset"])
def test_bad_backend_is_retried_elsewhere_and_marked_unhealthy(mode):
    with (
        FakeBackend("good") as good,
        FakeBackend(mode) as bad,
        RouterThread(CLUSTER | {"backends": [good.url, bad.url]}) as router,
    ):
        with httpx.Client(base_url=router.url, timeout=20) as client:
            for i in range(8):
                status, answer = exchange(client, stream=i % 2 == 1)
                assert status == 200, answer
                if isinstance(answer, dict):
                    assert answer["choices"][0]["text"] == "ok"
                else:
                    assert answer[-1] == "[DONE]" and all("choices" in e for e in answer[:-1])
        assert router.pool.backends[1].healthy is False
        assert router.pool.backends[0].healthy is True


@pytest.mark.parametrize("mode", ["garbage", "html500", "not_openai"])
def test_alone_a_bad_answer_becomes_a_502_naming_the_backend(mode):
    cluster = CLUSTER | {"backends": []}
    with (
        FakeBackend(mode) as bad,
        RouterThread(cluster | {"backends": [bad.url]}) as router,
        httpx.Client(base_url=router.url, timeout=20) as client,
    ):
        for stream in (False, True):
            status, answer = exchange(client, stream)
            assert status == 502, answer
            assert bad.url in answer["error"]["message"] and answer["error"]["type"] == "backend_error"


def test_a_stream_cut_without_done_ends_with_an_error_event():
    with FakeBackend("truncate") as cut, RouterThread(CLUSTER | {"backends": [cut.url]}) as router:
        with httpx.Client(base_url=router.url, timeout=20) as client:
            status, events = exchange(client, stream=True)
            assert status == 200
            assert events[0]["choices"][0]["text"] == "o"  # what was good is relayed
            assert "error" in events[-2] and cut.url in events[-2]["error"]["message"]
            assert "[DONE]" in events[-2]["error"]["message"] and events[-1] == "[DONE]"
            status, answer = exchange(client, stream=False)  # a cut JSON body: a 502, not half a body
            assert status == 502 and cut.url in answer["error"]["message"]
        assert router.pool.backends[0].last_error


def test_bad_answers_mark_a_backend_within_the_window_and_hold_it():
    with (
        FakeBackend("garbage") as bad,
        FakeBackend("good") as good,
        RouterThread(CLUSTER | {"backends": [bad.url, good.url]}) as router,
    ):
        with httpx.Client(base_url=router.url, timeout=20) as client:
            for _ in range(4):
                assert exchange(client, stream=False)[0] == 200
        backend = router.pool.backends[0]
        assert not backend.healthy
        time.sleep(0.6)  # several good /health probes: it stays out until the window passes
        assert not backend.healthy


def test_a_hanging_backend_is_timed_out_and_retried_elsewhere():
    with FakeBackend("hang") as hang, FakeBackend("good") as good:
        cluster = CLUSTER | {"backends": [hang.url, good.url], "request_timeout_s": 1.0, "stall_timeout_s": 1.0}
        with RouterThread(cluster) as router, httpx.Client(base_url=router.url, timeout=20) as client:
            for stream in (False, True, False):
                start = time.monotonic()
                status, answer = exchange(client, stream)
                assert status == 200, answer
                assert time.monotonic() - start < 5.0
            assert not router.pool.backends[0].healthy
    with FakeBackend("hang") as hang:
        cluster = CLUSTER | {"backends": [hang.url], "request_timeout_s": 1.0}
        with RouterThread(cluster) as router, httpx.Client(base_url=router.url, timeout=20) as client:
            status, answer = exchange(client, stream=False)
            assert status == 504 and hang.url in answer["error"]["message"]


def test_a_stalled_stream_ends_with_an_error_event():
    with FakeBackend("dribble") as slow:
        cluster = CLUSTER | {"backends": [slow.url], "stall_timeout_s": 0.5}
        with RouterThread(cluster) as router, httpx.Client(base_url=router.url, timeout=20) as client:
            start = time.monotonic()
            status, events = exchange(client, stream=True)
            assert status == 200 and time.monotonic() - start < 5.0
            assert events[0]["choices"][0]["text"] == "o"
            assert "error" in events[-2] and slow.url in events[-2]["error"]["message"] and events[-1] == "[DONE]"


def test_a_client_that_leaves_a_whole_answer_cancels_the_backend_request():
    with FakeBackend("slow") as slow, RouterThread(CLUSTER | {"backends": [slow.url]}) as router:
        with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=router.url, timeout=0.5) as client:
            client.post("/v1/completions", json=body(False))
        deadline = time.monotonic() + 8
        while not any(s[0] == "GONE" for s in slow.seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ("GONE", "/v1/completions", True) in slow.seen  # the router hung up on the backend too
