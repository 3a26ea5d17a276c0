"""The HTTP router in front of two testbed-serve backends, one killed mid-run: every request gets a
response or a clear error, and the rest go to the live backend."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from testbed import Engine
from testbed.cluster.http import RouterThread
from testbed.cluster.http.app import route_request
from testbed.cluster.http.backends import Backend, read_load
from testbed.config import EngineConfig
from testbed.server import ServerThread

from ..runner.helpers import ROOT

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_backend_process(tmp_path):
    """`python run.py mode=serve model=tiny` in its own process (so it can be killed)."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    args = ["mode=serve", "model=tiny", "cache.num_blocks=1024", f"server.port={port}", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.Popen(
        [sys.executable, "run.py", *args, "server.log_level=warning"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, "".join(log)
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "backend did not start:\n" + "".join(log)
        time.sleep(0.2)


def body(i, max_tokens, stream):
    return {"model": "tiny", "prompt": [100 + (i * 13 + j) % 3000 for j in range(24)], "max_tokens": max_tokens,
            "ignore_eos": True, "stream": stream}  # fmt: skip


def outcome(response_or_stream):
    """('ok' | 'error', backend, detail) for one finished exchange."""
    kind, backend, status, text = response_or_stream
    if status != 200:
        assert "error" in json.loads(text), text  # an error status always carries an OpenAI error body
        return "error", backend, text
    if kind == "stream":
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", text[-300:]  # every stream is closed properly
        errors = [e for e in events[:-1] if "error" in json.loads(e)]
        return ("error", backend, errors[0]) if errors else ("ok", backend, len(events) - 1)
    return "ok", backend, json.loads(text)["choices"][0]["text"]


def stream(client, url, i, max_tokens, first_chunk=None):
    with client.stream("POST", url + "/v1/completions", json=body(i, max_tokens, True)) as r:
        chunks = []
        for chunk in r.iter_text():
            chunks.append(chunk)
            if first_chunk is not None and len(chunks) == 1:
                first_chunk.set()
        return "stream", r.headers.get("x-testbed-backend"), r.status_code, "".join(chunks)


def post(client, url, i, max_tokens):
    r = client.post(url + "/v1/completions", json=body(i, max_tokens, False))
    return "json", r.headers.get("x-testbed-backend"), r.status_code, r.text


def test_a_killed_backend_loses_no_request_silently(tmp_path):
    victim, victim_url = start_backend_process(tmp_path)
    try:
        engine = Engine(EngineConfig(model="tiny", num_blocks=1024))
        cluster = {"backends": [], "router": "round_robin", "probe_interval_s": 0.2, "unhealthy_after": 2}
        with ServerThread(engine) as live:
            cluster["backends"] = [live.url, victim_url]
            with RouterThread(cluster) as router, httpx.Client(timeout=120) as client:
                assert client.get(router.url + "/health").json()["status"] == "ok"
                # phase 1: both backends serve (round robin), and long streams are running on the victim
                first = [post(client, router.url, i, 4) for i in range(4)]
                assert {outcome(r)[:2] for r in first} == {("ok", live.url), ("ok", victim_url)}
                started = [threading.Event() for _ in range(4)]
                with ThreadPoolExecutor(8) as pool:
                    long = [pool.submit(stream, client, router.url, 10 + i, 600, started[i]) for i in range(4)]
                    for event in started:
                        assert event.wait(60)
                    victim.send_signal(signal.SIGKILL)  # mid-stream, no goodbye
                    victim.wait(30)
                    # phase 2: requests keep coming while the router finds out
                    later = [pool.submit(post if i % 2 else stream, client, router.url, 100 + i, 8) for i in range(10)]
                    results = [f.result() for f in long + later]
        outcomes = [outcome(r) for r in results]
        long_outcomes, later_outcomes = outcomes[:4], outcomes[4:]
        # the victim's streams end with a clear error event; the live backend's finish
        for (kind, backend, detail), result in zip(long_outcomes, results[:4]):
            assert backend == result[1]
            if backend == victim_url:
                assert kind == "error" and victim_url in detail and "mid-stream" in detail
            else:
                assert kind == "ok" and detail == 600
        assert any(r[1] == victim_url for r in results[:4])  # the kill did cut some stream
        # every later request was answered by the live backend
        assert all(kind == "ok" and backend == live.url for kind, backend, _ in later_outcomes), later_outcomes
        pool_state = router.pool.backends
        assert not pool_state[1].healthy and pool_state[0].healthy
    finally:
        if victim.poll() is None:
            victim.kill()


def test_router_health_and_metrics_with_every_backend_down():
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    cluster = {"backends": dead, "probe_interval_s": 0.1, "unhealthy_after": 1, "probe_timeout_s": 0.5}
    with RouterThread(cluster) as router, httpx.Client(timeout=30) as client:
        health = client.get(router.url + "/health?detail=true")
        assert health.status_code == 503 and not any(b["healthy"] for b in health.json()["backends"])
        r = client.post(router.url + "/v1/completions", json=body(0, 4, False))
        assert r.status_code == 503 and "no healthy backend" in r.json()["error"]["message"]
        metrics = client.get(router.url + "/metrics").text
        assert 'testbed_router_backend_healthy{backend="0"} 0.0' in metrics
        assert 'testbed_router_probe_failures_total{backend="1"}' in metrics
        assert "127.0.0.1" not in metrics  # no backend host unless cluster.metrics_backend_urls
        assert "testbed_router_no_backend_total 1.0" in metrics
        assert client.post(router.url + "/v1/completions", content=b"{not json").status_code == 400
    with RouterThread(cluster | {"metrics_backend_urls": True}) as router, httpx.Client(timeout=30) as client:
        metrics = client.get(router.url + "/metrics").text
        assert f'testbed_router_backend_healthy{{backend="{dead[0]}"}} 0.0' in metrics


def test_router_reads_backend_load_and_routes_by_prompt():
    backend = Backend(0, "http://x")
    read_load(backend, "vllm:num_requests_running{engine=\"0\"} 3\nvllm:num_requests_waiting 2\n"
                       "vllm:kv_cache_usage_perc 0.25\n")  # fmt: skip
    assert (backend.running, backend.waiting, backend.free_blocks) == (3, 2, 750)
    ids = route_request({"prompt": list(range(40))})
    assert ids.prompt_len == 40 and len(ids.block_hashes) == 2
    same = route_request({"prompt": [list(range(40)), [1, 2]]})
    assert same.block_hashes == ids.block_hashes  # a batch goes where its first prompt goes
    chat = route_request({"messages": [{"role": "user", "content": "x" * 300}]})
    assert len(chat.block_hashes) >= 4


def test_mode_route_needs_backends():
    from testbed.cluster.http import make_router_server

    with pytest.raises(ValueError, match="cluster.backends"):
        make_router_server({"backends": []})
    with pytest.raises(ValueError, match="not an http"):
        make_router_server({"backends": ["ftp://x"]})
