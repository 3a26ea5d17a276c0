"""Run folders drawn from a known latency model, for the statistics tests (aggregate, compare).

A request's TTFT is base_i * run_factor * noise: base_i is fixed by the trace (request i), run_factor is
shared by every request of a run (machine load), noise is per request. Output: the files the runner
writes (requests.parquet, steps.parquet, summary.json, config.yaml) and sweep.csv rows."""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.results.files import append_sweep_row, sweep_row
from experiments.results.metrics import summarize
from experiments.results.recorder import requests_frame

N_REQUESTS = 400
TOKENS = 8


def trace_bases(n=N_REQUESTS, seed=123):
    """Per-request base TTFT (s) and decode gap (s): the trace's share of the latency."""
    rng = np.random.default_rng(seed)
    return rng.lognormal(np.log(0.2), 0.6, n), rng.lognormal(np.log(0.02), 0.3, n)


def write_run(
    run_dir: Path,
    *,
    seed: int,
    repeat: int = 0,
    run_sd: float = 0.03,
    noise_sd: float = 0.1,
    ttft_scale: float = 1.0,
    preempt: dict | None = None,
    config_id: str = "cfgA",
    table: Path | None = None,
    extra: dict | None = None,
    n_requests: int = N_REQUESTS,
    workload: int = 123,
    executor: str | None = None,
) -> dict:
    """One run folder; preempt: {request index: extra queueing seconds, counted as one preemption};
    workload: the trace's seed (its requests' base latencies and arrivals); executor: summary.json's
    (None: not recorded, as a real run's of an older version)."""
    rng = np.random.default_rng(seed)
    base_ttft, base_gap = trace_bases(n_requests, workload)
    factor = float(np.exp(rng.normal(0, run_sd)))
    rows, steps = [], []
    for i, (b, g) in enumerate(zip(base_ttft, base_gap)):
        arrival = 0.05 * i + (workload - 123) * 1e-3
        delay = (preempt or {}).get(i, 0.0)
        ttft = b * factor * ttft_scale * float(np.exp(rng.normal(0, noise_sd))) + delay
        gap = g * factor * float(np.exp(rng.normal(0, noise_sd)))
        times = [arrival + ttft + k * gap for k in range(TOKENS)]
        rid = f"r{i}"
        rows.append(
            {
                "request_id": rid,
                "trace_arrival_s": arrival,
                "arrival_time": arrival,
                "first_scheduled_time": arrival + delay + 0.2 * (ttft - delay),
                "first_token_time": times[0],
                "finish_time": times[-1],
                "prompt_tokens": 32,
                "output_tokens": TOKENS,
                "target_output_tokens": TOKENS,
                "cached_tokens": 0,
                "num_preemptions": int(i in (preempt or {})),
                "finish_reason": "length",
                "trace_prompt_tokens": 32,
                "trace_output_tokens": TOKENS,
                "trace_line": str(i),
                "token_times": times,
            }
        )
        chunks = 1 + int(i in (preempt or {}))  # a preempted request prefilled twice
        for _ in range(chunks):
            steps.append({"step": len(steps), "scheduled_ids": [rid], "prefill_ids": [rid], "preempted_ids": []})
    requests = requests_frame(rows)
    step_frame = pd.DataFrame(steps)
    step_frame["duration_s"] = 0.01
    for col in ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_running", "num_waiting"):
        step_frame[col] = 1
    step_frame["kv_usage"] = step_frame["frag_internal"] = step_frame["frag_reserved"] = 0.0
    step_frame["frag_external"] = 0.0
    start, end = 0.0, float(requests["finish_time"].max())
    summary = summarize(requests, step_frame, start, end)
    summary.update({"config_id": config_id, "repeat": repeat, "seed": seed, "start_time": start, "end_time": end})
    if executor is not None:
        summary["executor"] = executor
    run_dir.mkdir(parents=True, exist_ok=True)
    requests.to_parquet(run_dir / "requests.parquet", index=False)
    step_frame.to_parquet(run_dir / "steps.parquet", index=False)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "config.yaml").write_text(f"seed: {seed}\n")
    if table is not None:
        info = {"run_dir": str(run_dir.relative_to(table.parent)), "scheduler.name": config_id, **(extra or {})}
        append_sweep_row(table, sweep_row(summary, info))
    return summary


def write_sweep(sweep_dir: Path, repeats: int, first_seed: int, config_id: str = "cfgA", **kwargs) -> Path:
    table = sweep_dir / "sweep.csv"
    for r in range(repeats):
        write_run(
            sweep_dir / f"{config_id}-repeat{r}",
            seed=first_seed + r,
            repeat=r,
            config_id=config_id,
            table=table,
            **kwargs,
        )
    return sweep_dir
