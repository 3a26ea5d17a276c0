"""`python run.py mode=serve ...` in a subprocess: it serves the configured engine under the config's
model name, and on SIGTERM lets the in-flight stream finish, then exits cleanly."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_py_serve_and_sigterm_drains(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "run.py",
            "mode=serve",
            "model=tiny",
            "cache.num_blocks=1024",
            "server.host=127.0.0.1",
            f"server.port={port}",
            "server.api_key=k3y",
            "server.graceful_timeout_s=60",
            "server.log_level=info",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, "".join(log)
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up:\n" + "".join(log)
            time.sleep(0.25)

        auth = {"Authorization": "Bearer k3y"}
        assert httpx.get(url + "/v1/models").status_code == 401
        models = httpx.get(url + "/v1/models", headers=auth).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]

        # a long stream in flight when SIGTERM arrives: it must run to its end
        body = {"model": "tiny", "prompt": [3] * 32, "max_tokens": 200, "ignore_eos": True, "stream": True}
        events, finish = [], []
        with (
            httpx.Client(timeout=60) as client,
            client.stream("POST", url + "/v1/completions", json=body, headers=auth) as r,
        ):
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                events.append(data)
                if len(events) == 3:
                    proc.send_signal(signal.SIGTERM)
                if data != "[DONE]":
                    reason = json.loads(data)["choices"][0]["finish_reason"]
                    if reason:
                        finish.append(reason)
        assert events[-1] == "[DONE]" and finish == ["length"]
        assert len(events) == 200 + 1
        assert proc.wait(timeout=60) == 0, "".join(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(log)
    assert "draining" in text
    # new connections are refused once it is gone
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=2)


def test_console_script_flags(monkeypatch):
    """`testbed-serve --port 9 --api-key K model=tiny` becomes Hydra overrides for run.py."""
    import runpy

    from serve import cli

    seen = {}
    monkeypatch.setattr(
        runpy, "run_path", lambda path, run_name: seen.update(argv=list(sys.argv), path=path, run_name=run_name)
    )
    monkeypatch.setattr(sys, "argv", ["testbed-serve"])
    cli(["--port", "9001", "--api-key=K", "--host", "0.0.0.0", "--max-waiting", "7", "model=tiny"])
    assert seen["argv"][1:] == [
        "mode=serve",
        "server.port=9001",
        "server.api_key=K",
        "server.host=0.0.0.0",
        "server.max_waiting=7",
        "model=tiny",
    ]
    assert seen["path"] == str(ROOT / "run.py") and seen["run_name"] == "__main__"
