"""The generated constraints of test_constraint_fuzz.py through a live server, streamed or not: every answer
is 2xx or 4xx (never a 5xx, never an error event inside a 200 stream) and comes within the compile budget
plus a few tokens' generation (never a hang). Kept small for CI: a tiny model, 4 tokens, 40 bodies."""

import json
import time
from collections import Counter

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed import Engine
from testbed.config import EngineConfig
from testbed.server import ServerThread

from .test_constraint_fuzz import fields

COMPILE_TIMEOUT_S = 2.0
ANSWER_WITHIN_S = COMPILE_TIMEOUT_S + 10.0  # 4 tokens of a tiny model, on a loaded machine
SEEN: Counter = Counter()  # status codes of the generated bodies (printed with -s for the README)
SLOWEST: list[float] = [0.0]


@pytest.fixture(scope="module")
def client(one_torch_thread):
    config = EngineConfig(
        model="tiny",
        tokenizer="smollm2-135m",
        kernel="torch",
        num_blocks=256,
        max_num_seqs=8,
        structured_outputs_config={"compile_timeout_s": COMPILE_TIMEOUT_S},
    )
    with ServerThread(Engine(config)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c


def post(client: httpx.Client, body: dict) -> tuple[int, str]:
    # encoded here (ASCII escapes): a generated lone surrogate reaches the server instead of failing the client
    content, headers = json.dumps(body).encode(), {"content-type": "application/json"}
    with client.stream("POST", "/v1/completions", content=content, headers=headers) as r:
        return r.status_code, r.read().decode(errors="replace")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extra=fields, stream=st.booleans())
def test_generated_constraints_over_http_are_2xx_or_4xx_never_5xx_or_a_hang(client, extra, stream):
    body = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 4, "stream": stream} | extra
    start = time.monotonic()
    status, text = post(client, body)
    elapsed = time.monotonic() - start
    SEEN[status] += 1
    SLOWEST[0] = max(SLOWEST[0], elapsed)
    assert 200 <= status < 500, (status, text[:300], body)
    if status == 200 and stream:
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", text[-300:]
        assert not any("error" in json.loads(e) for e in events[:-1]), text[:300]
    elif status >= 400:
        assert json.loads(text)["error"]["message"], text[:300]  # an OpenAI-style error body
    assert elapsed < ANSWER_WITHIN_S, (elapsed, body)


def test_the_server_stays_healthy_after_the_fuzz(client):
    print(f"\ngenerated bodies by status: {dict(sorted(SEEN.items()))}; slowest answer {SLOWEST[0]:.2f} s")
    assert client.get("/health").status_code == 200
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 2})
    assert r.status_code == 200
