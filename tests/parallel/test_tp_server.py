"""`run.py mode=serve` under tensor parallelism, in a subprocess: /v1/completions answers with the tokens (and
text) the same composed config gives on one rank, and SIGTERM ends the server and every worker it started."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import psutil
import pytest
from hydra import compose, initialize_config_module

from experiments.run.engine_config import engine_config_from_cfg
from testbed.detokenize import token_strings
from testbed.engine import Engine
from testbed.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
MAX_TOKENS = 12


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def reference(overrides: list[str], prompts: list[list[int]]) -> list[tuple[list[str], list[float], str]]:
    """(token strings, their logprobs, text) per prompt from the same composed config on one rank."""
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    config = engine_config_from_cfg(cfg)
    engine = Engine(replace(config, parallel=replace(config.parallel, tensor_parallel_size=1)))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=1, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    done = {}
    while engine.has_unfinished():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    out = []
    for i in range(len(prompts)):
        seq = done[str(i)].outputs[0]
        logprobs = [lp[t].logprob for t, lp in zip(seq.token_ids, seq.logprobs)]
        out.append((token_strings(engine.tokenizer, list(seq.token_ids)), logprobs, seq.text))
    return out


def wait_up(proc, url: str, log: list[str], timeout: float = 180):
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, "".join(log)
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not come up:\n" + "".join(log)
        time.sleep(0.25)


def ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def start(overrides: list[str], n: int, tmp_path: Path, attempts: int = 3):
    """(server process, its url, its log): a fresh free port per attempt, since the port found free can be taken
    (torch.distributed's workers start before the server binds) before the server binds it."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for attempt in range(attempts):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        run_dir = tmp_path / str(attempt)
        command = [sys.executable, "run.py", "mode=serve", *overrides, f"parallel.tensor_parallel_size={n}",
                   "server.host=127.0.0.1", f"server.port={port}", f"hydra.run.dir={run_dir}"]  # fmt: skip
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log: list[str] = []
        reader = threading.Thread(target=lambda proc=proc, log=log: log.extend(proc.stdout), daemon=True)
        reader.start()
        try:
            wait_up(proc, url, log)
            return proc, url, log
        except AssertionError:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(proc.pid).children(recursive=True):  # its workers, if any are left
                    child.kill()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            reader.join(timeout=10)
            if "address already in use" not in "".join(log) or attempt == attempts - 1:
                raise


@pytest.mark.parametrize(
    "model, n",
    [("tiny", 2), pytest.param("smollm2-135m", 3, marks=pytest.mark.slow)],
)
def test_served_tokens_equal_one_rank_and_sigterm_ends_every_process(model, n, tmp_path):
    overrides = [f"model={model}", "kernel=torch", "cache.num_blocks=256", "progress=false"]
    prompts = [[1, 5, 9, 13], [1, *range(40, 70)]]
    proc, url, log = start(overrides, n, tmp_path)
    children: list[int] = []
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)  # the workers, multiprocessing's helper
        children = [c.pid for c in kids]
        assert sum("spawn_main" in " ".join(c.cmdline()) for c in kids) >= n - 1, "".join(log)
        body = {"model": model, "prompt": prompts, "max_tokens": MAX_TOKENS, "temperature": 0.0,
                "ignore_eos": True, "logprobs": 1}  # fmt: skip
        response = httpx.post(url + "/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        choices = sorted(response.json()["choices"], key=lambda c: c["index"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, "".join(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        deadline = time.monotonic() + 15
        while not all(ended(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in children if not ended(pid)]
        for pid in left:  # never leave them running, even when the test fails
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
    assert not left, f"still running after the server exited: {left}"

    ref = reference(overrides, prompts)  # after the server: the two never share the cores
    for choice, (tokens, logprobs, text) in zip(choices, ref, strict=True):
        assert choice["logprobs"]["tokens"] == tokens and len(tokens) == MAX_TOKENS
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(logprobs, abs=1e-4)
        assert choice["text"] == text
