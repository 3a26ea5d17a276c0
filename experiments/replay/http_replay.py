"""Replay a trace against a running OpenAI-compatible server, streaming (like `vllm bench serve`).

    from experiments.replay.http_replay import replay_http
    run = replay_http(trace.requests, "http://127.0.0.1:8000", model="tiny")
    run.requests        # one row per request, experiments.results.recorder.REQUEST_COLUMNS (+ "error")
    run.summary()       # experiments.results.metrics.request_summary: the in-process runner's metrics

    # the experiment of `python run.py trace=... replay=...`, over HTTP (same result files):
    python -m experiments.replay.http_replay --url http://127.0.0.1:8000 trace=azure replay=open_loop \
        trace.max_requests=50
    python -m experiments.replay.http_replay --url http://127.0.0.1:8000 replay=sessions trace=sessions  # multi-turn
    python -m experiments.replay.http_replay --url URL replay=sessions trace=sharegpt_sessions trace.path=sg.json

Each RequestSpec is sent as a streaming /v1/completions request (prompt as token ids, max_tokens,
ignore_eos, temperature 0 by default) following experiments.replay.driver's modes: open_loop at start +
arrival_s (already time-scaled by the loader), offline all at once, closed_loop with `concurrency` in
flight; replay=sessions is experiments.sessions.http_replay (each turn's prompt: the server's own tokens
of the history, returned with return_token_ids; ShareGPT text is tokenized by the server's /tokenize).
Times are taken on the client's monotonic clock as chunks arrive. With
`stream_options.continuous_usage_stats` (this server, vLLM) each chunk says how many tokens it carries,
otherwise each non-empty chunk counts as one token; the tokens of one chunk share its timestamp, which
is how experiments.results.metrics counts ITL (per chunk).

cached_tokens comes from usage.prompt_tokens_details where the server reports it (this server; vLLM with
--enable-prompt-tokens-details), else 0. Columns the client cannot see (first_scheduled_time,
num_preemptions) are NaN/0; the server's /metrics has the engine-side view. A failed request has
finish_reason "error" and the reason in "error"; it counts as failed in the summary, as aborts do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.replay.driver import check_mode
from experiments.results.metrics import request_summary
from experiments.results.recorder import REQUEST_COLUMNS, request_row, requests_frame
from experiments.traces.types import RequestSpec

COLUMNS = REQUEST_COLUMNS + ["error"]


def _row(spec: RequestSpec, arrival_time: float) -> dict:
    return {**request_row(spec, arrival_time), "error": ""}


def request_body(spec: RequestSpec, model: str, temperature: float = 0.0, extra: dict | None = None) -> dict:
    body = {
        "model": model,
        "prompt": list(spec.prompt_token_ids),
        "max_tokens": int(spec.max_tokens),
        "temperature": temperature,
        "ignore_eos": bool(spec.ignore_eos),
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if spec.priority:
        body["priority"] = int(spec.priority)
    body.update(extra or {})
    return body


def _auth_headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass
class TokenIds:
    """The token ids a server returns with `return_token_ids` (vLLM's extension): the prompt as the engine
    saw it and the tokens it generated (choice 0)."""

    prompt: list[int] | None = None
    generated: list[int] | None = None


async def _send(
    client, url: str, headers: dict, spec: RequestSpec, body: dict, row: dict, ids: TokenIds | None = None
) -> None:
    """Stream one request, filling row in place (times on time.monotonic), and ids if given (the body asks
    for return_token_ids)."""
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                row["error"] = f"HTTP {response.status_code}: {text[:500]}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                now = time.monotonic()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    err = chunk["error"]
                    row["error"] = str(err.get("message", err)) if isinstance(err, dict) else str(err)
                    continue
                usage, choices = chunk.get("usage"), chunk.get("choices") or []
                cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
                if cached is not None:
                    row["cached_tokens"] = int(cached)
                if not choices:
                    continue  # the final usage-only chunk
                if ids is not None:
                    _take_ids(ids, chunk, choices[0])
                if usage is not None:
                    n_new = int(usage.get("completion_tokens", 0)) - row["output_tokens"]
                else:
                    n_new = 1 if choices[0].get("text") or (choices[0].get("delta") or {}).get("content") else 0
                if n_new > 0:
                    if row["first_token_time"] is None:
                        row["first_token_time"] = now
                    row["token_times"].extend([now] * n_new)
                    row["output_tokens"] += n_new
                if choices[0].get("finish_reason"):
                    row["finish_reason"] = choices[0]["finish_reason"]
                    row["finish_time"] = now
    except Exception as e:  # a failed request is a row, not a failed replay
        row["error"] = f"{type(e).__name__}: {e}"
    finally:
        if row["error"]:
            row["finish_reason"], row["finish_time"] = "error", None
        elif row["finish_reason"] is None:  # stream ended without a finish reason
            row["finish_reason"], row["error"] = "error", "stream ended without finish_reason"


def _take_ids(ids: TokenIds, chunk: dict, choice: dict) -> None:
    prompt = choice.get("prompt_token_ids", chunk.get("prompt_token_ids"))  # completions / chat
    if prompt is not None:
        ids.prompt = list(prompt)
    if choice.get("token_ids") is not None:
        ids.generated = (ids.generated or []) + list(choice["token_ids"])


@dataclass
class HttpReplay:
    requests: pd.DataFrame
    start_time: float  # time.monotonic when sending began
    end_time: float  # last finish (or now, if nothing finished)

    def summary(self, slo=None, **kwargs) -> dict:
        return request_summary(self.requests, self.start_time, self.end_time, slo, **kwargs)


async def replay_http_async(
    specs: Sequence[RequestSpec],
    base_url: str,
    model: str,
    api_key: str | None = None,
    mode: str = "open_loop",
    concurrency: int | None = None,
    temperature: float = 0.0,
    timeout_s: float | None = 600.0,
    extra_body: dict | None = None,
) -> HttpReplay:
    """mode: open_loop (each request at its arrival_s), offline (all at once) or closed_loop
    (`concurrency` in flight, trace order), as experiments.replay.driver's drivers."""
    import httpx

    check_mode(mode, concurrency)
    base = base_url.rstrip("/")
    url = base + ("" if base.endswith("/v1") else "/v1") + "/completions"
    headers = _auth_headers(api_key)
    specs = list(specs) if mode == "closed_loop" else sorted(specs, key=lambda s: s.arrival_s)
    rows: list[dict] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        t0 = time.monotonic()

        def body(spec):
            return request_body(spec, model, temperature, extra_body)

        if mode == "closed_loop":  # a new request the moment one finishes
            if concurrency is None:  # check_mode refuses it
                raise ValueError("replay.concurrency: closed-loop replay needs an integer >= 1, got None")
            queue = list(reversed(specs))

            async def worker():
                while queue:
                    spec = queue.pop()
                    row = _row(spec, time.monotonic())
                    rows.append(row)
                    await _send(client, url, headers, spec, body(spec), row)

            await asyncio.gather(*[worker() for _ in range(concurrency)])
        else:
            tasks = []
            for spec in specs:
                arrival = 0.0 if mode == "offline" else spec.arrival_s
                delay = t0 + arrival - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                row = _row(spec, t0 + arrival)
                rows.append(row)
                tasks.append(asyncio.ensure_future(_send(client, url, headers, spec, body(spec), row)))
            await asyncio.gather(*tasks)
    df = requests_frame(rows, COLUMNS)
    finished = df["finish_time"].dropna()
    return HttpReplay(df, t0, float(finished.max()) if len(finished) else time.monotonic())


def replay_http(specs: Sequence[RequestSpec], base_url: str, model: str, **kwargs) -> HttpReplay:
    """Blocking wrapper of replay_http_async (runs its own event loop)."""
    return asyncio.run(replay_http_async(specs, base_url, model, **kwargs))


# ---- the experiment over HTTP: same config, same result files as experiments.run.runner --------------------------
def server_info(base_url: str, api_key: str | None = None) -> dict:
    """The served model's card: id, max_model_len, vocab_size (this server's extension fields; llama-server's
    are taken from its `meta`)."""
    import httpx

    base = base_url.rstrip("/").removesuffix("/v1")
    headers = _auth_headers(api_key)
    r = httpx.get(base + "/v1/models", headers=headers, timeout=30)
    r.raise_for_status()
    card = r.json()["data"][0]
    meta = card.get("meta") or {}  # llama-server's card keeps them here
    card.setdefault("max_model_len", meta.get("n_ctx"))
    card.setdefault("vocab_size", meta.get("n_vocab"))
    return card


def run_trace_http(cfg, run_dir: str | Path, url: str, api_key: str | None = None, quiet: bool = False) -> dict:
    """experiments.run.runner.run_trace, with a running server in place of the in-process engine: the same
    trace, length policy, replay mode, SLOs and percentiles from cfg; summary.json, requests.parquet and
    a sweep-table row in run_dir. Engine-side columns (steps, KV) are not visible over HTTP."""
    from omegaconf import OmegaConf

    from experiments.results.files import SWEEP_TABLE, append_sweep_row, sweep_row, write_run
    from experiments.results.metrics import DEFAULT_PERCENTILES, check_slo
    from experiments.run.replay_run import positive
    from experiments.run.runner import apply_length_policy, check_session_config, config_value
    from experiments.sessions import is_session_trace, load_sessions, session_report
    from experiments.sessions.http_replay import HttpSessionReplay, replay_sessions_http
    from experiments.sessions.metrics import session_summary, turns_table
    from experiments.sessions.server_tokenizer import ServerTokenizer
    from experiments.traces import load_trace

    run_dir = Path(run_dir)
    trace_cfg = config_value(cfg, "trace")
    if not trace_cfg:
        raise ValueError(
            "an HTTP replay needs a trace: trace=azure|mooncake|burstgpt|sharegpt|synthetic, or replay=sessions "
            "with trace=sessions|sharegpt_sessions|mooncake_sessions"
        )
    slo = check_slo(config_value(cfg, "slo"))
    percentiles = list(config_value(cfg, "metrics.percentiles") or DEFAULT_PERCENTILES)
    replay_cfg = config_value(cfg, "replay") or {}
    mode = replay_cfg.get("name", "open_loop")
    info = server_info(url, api_key)
    vocab_size, max_model_len = int(info.get("vocab_size") or 32000), int(info["max_model_len"])
    tables: dict[str, pd.DataFrame] = {}
    run: HttpReplay
    # what both replays take from the replay group (a request's length caps: sessions here, traces on load)
    sent: dict[str, Any] = {
        "api_key": api_key,
        "concurrency": replay_cfg.get("concurrency"),
        "temperature": replay_cfg.get("temperature", 0.0) or 0.0,
    }
    if mode == "sessions" or is_session_trace(trace_cfg):
        check_session_config(cfg, trace_cfg)
        with ServerTokenizer(url, info["id"], api_key) as tokenizer:  # text sources: the served model's ids
            sessions = load_sessions(trace_cfg, vocab_size, max_model_len, tokenizer=tokenizer)
        report = {"format": trace_cfg.get("name"), "path": trace_cfg.get("path"), **session_report(sessions)}
        run = replay_sessions_http(
            sessions,
            url,
            info["id"],
            max_model_len=max_model_len,
            max_prompt_tokens=positive(replay_cfg.get("max_prompt_tokens"), "replay.max_prompt_tokens", True),
            max_output_tokens=positive(replay_cfg.get("max_output_tokens"), "replay.max_output_tokens", True),
            **sent,
        )
        num_specs = len(sessions)
    else:
        trace = load_trace(trace_cfg, vocab_size=vocab_size, max_model_len=max_model_len)
        specs, length_report = apply_length_policy(trace.requests, replay_cfg)
        report = {**trace.report, "replay_length_policy": length_report}
        run = replay_http(specs, url, info["id"], mode=mode, **sent)
        num_specs = len(specs)
    summary = run.summary(slo, percentiles=percentiles)
    if isinstance(run, HttpSessionReplay):
        tables["turns.parquet"] = turns_table(run.turns, run.requests)
        summary.update(session_summary(tables["turns.parquet"], num_specs, run.turns_cut))
    experiment = config_value(cfg, "experiment", "default")
    summary.update(
        {
            "experiment": experiment,
            "replay": mode,
            "trace": report.get("format"),
            "target": "http",
            "url": url,
            "model": info["id"],
            "num_requests": num_specs,
            "num_sent": len(run.requests),
            "start_time": run.start_time,
            "end_time": run.end_time,
            "slo": slo,
            "percentiles": percentiles,
        }
    )
    write_run(
        run_dir,
        config_yaml=OmegaConf.to_yaml(cfg),
        requests=run.requests,
        steps=pd.DataFrame(),
        summary=summary,
        trace_report=report,
        tables=tables,
    )
    table = Path(config_value(cfg, "results.sweep_table") or run_dir.parent / SWEEP_TABLE)
    append_sweep_row(
        table,
        sweep_row(
            summary,
            {
                "run_dir": run_dir.name,
                "target": "http",
                "model.name": info["id"],
                "trace.name": trace_cfg.get("name"),
                "replay.name": mode,
            },
        ),
    )
    if not quiet:
        keys = (
            "completed",
            "failed",
            "duration",
            "request_throughput",
            "output_throughput",
            "mean_ttft_ms",
            "median_ttft_ms",
            "mean_tpot_ms",
            "mean_itl_ms",
            "mean_e2el_ms",
        )
        print(json.dumps({k: summary.get(k) for k in keys}, indent=2, default=str))
        print(f"results: {run_dir}", file=sys.stderr)
    return summary


def main(argv: list[str] | None = None) -> dict:
    """python -m experiments.replay.http_replay --url URL [--api-key K] [--out DIR] [overrides of conf/config.yaml]"""
    parser = argparse.ArgumentParser(
        description="Replay a trace against a running server, with the experiment config of run.py.",
        epilog="overrides: as for run.py, e.g. trace=azure replay=open_loop trace.max_requests=100 "
        "trace.time_scale=2 (the engine keys are ignored: the server has its own engine)",
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--out", default=None, help="results folder (default results/<experiment>/http-<time>)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)

    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException

    overrides = list(args.overrides)
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        try:
            cfg = compose(config_name="config", overrides=overrides)
        except HydraException:  # a config without trace/replay groups in its defaults
            cfg = compose(
                config_name="config",
                overrides=["+" + o if o.split("=", 1)[0] in ("trace", "replay") else o for o in overrides],
            )
    out = Path(args.out or f"results/{cfg.get('experiment') or 'default'}/http-{time.strftime('%Y%m%d-%H%M%S')}")
    return run_trace_http(cfg, out, args.url, args.api_key)


if __name__ == "__main__":
    main()
