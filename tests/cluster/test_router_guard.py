"""The router guards its door as the server does: its own api_key (the server's 401 body, for every wrong
form), credentials passed on to backends (/v1/models too), /health without backend internals unless asked
with the key, a body over the limit refused once with 413 before any backend sees it, malformed or deeply
nested JSON an OpenAI-style 400."""

import httpx
import pytest

from testbed.cluster.http import RouterThread

from .fake_backends import FakeBackend

KEY = "sk-router-test"
WRONG = [None, "", "Bearer", "Bearer wrong", f"Basic {KEY}", f"Bearer {KEY}x", f"bearer{KEY}"]


@pytest.fixture()
def routed():
    with FakeBackend("good") as a, FakeBackend("good") as b:
        # no health probe runs during a test: `healthy` then moves only by what the requests themselves do
        # (a probe timing out on a loaded machine would mark a backend unhealthy for reasons of its own)
        cluster = {"backends": [a.url, b.url], "router": "round_robin", "probe_interval_s": 3600}
        with RouterThread(cluster, api_key=KEY, max_body_bytes=4096) as router:
            yield router, (a, b)


def body() -> dict:
    return {"model": "m", "prompt": "hi", "max_tokens": 2}


def test_api_key_is_enforced_with_the_servers_401(routed):
    router, backends = routed
    with httpx.Client(base_url=router.url, timeout=10) as client:
        for auth in WRONG:
            headers = {} if auth is None else {"Authorization": auth}
            for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                                 ("POST", "/tokenize"), ("POST", "/detokenize")):  # fmt: skip
                r = client.request(method, path, json=body() if method == "POST" else None, headers=headers)
                assert r.status_code == 401, (auth, path, r.text)
                assert r.json()["error"]["code"] == "invalid_api_key"
        assert not any(seen for b in backends for seen in b.seen)  # nothing unauthenticated got through
        good = {"Authorization": f"Bearer {KEY}"}
        assert client.post("/v1/completions", json=body(), headers=good).status_code == 200
        assert client.get("/v1/models", headers=good).status_code == 200
    seen = [s for b in backends for s in b.seen]
    assert ("GET", "/v1/models", f"Bearer {KEY}") in seen and ("POST", "/v1/completions", f"Bearer {KEY}") in seen


def test_health_keeps_backend_internals_behind_the_key(routed):
    router, backends = routed
    with httpx.Client(base_url=router.url, timeout=10) as client:
        plain = client.get("/health")
        assert plain.status_code == 200 and plain.json()["healthy_backends"] == 2
        assert all(b.url not in plain.text for b in backends)
        assert client.get("/health?detail=true").status_code == 401
        detail = client.get("/health?detail=true", headers={"Authorization": f"Bearer {KEY}"})
        assert {b["url"] for b in detail.json()["backends"]} == {b.url for b in backends}


def test_body_limit_and_malformed_json_are_refused_at_the_router(routed):
    router, backends = routed
    auth = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    with httpx.Client(base_url=router.url, timeout=10) as client:
        big = client.post("/v1/completions", content=b'{"prompt": "' + b"x" * 10_000 + b'"}', headers=auth)
        assert big.status_code == 413 and "server.max_body_bytes" in big.json()["error"]["message"]
        for bad in (b"{not json", b"[" * 2000 + b"]" * 2000, b'"a string"'):
            r = client.post("/v1/completions", content=bad, headers=auth)
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
        deep = b'{"a": ' + b"[" * 1500 + b"]" * 1500 + b"}"
        r = client.post("/v1/completions", content=deep, headers=auth)
        assert r.status_code == 400, r.text
    assert not any(seen for b in backends for seen in b.seen)  # no backend saw any of them
    assert all(b.healthy for b in router.pool.backends)


def test_a_tokenizer_answer_without_its_field_is_a_502_naming_the_backend():
    cluster = {"router": "round_robin", "probe_interval_s": 0.2}
    # the fake answers every POST with a completion, which is not a /tokenize answer
    with FakeBackend("good") as fake, RouterThread(cluster | {"backends": [fake.url]}) as router:
        r = httpx.post(router.url + "/tokenize", json={"prompt": "hi"}, timeout=10)
        assert r.status_code == 502 and fake.url in r.json()["error"]["message"]
        assert "`tokens`" in r.json()["error"]["message"]
        r = httpx.post(router.url + "/detokenize", content=b"{not json", timeout=10)
        assert r.status_code == 400 and fake.seen == [("POST", "/tokenize", None)]
