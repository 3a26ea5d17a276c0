"""Serving metrics over a run's requests and steps tables, defined as `vllm bench serve` defines them.

Per request (times on the engine clock, seconds):
    TTFT  = first_token_time - arrival_time
    E2EL  = finish_time - arrival_time
    TPOT  = (E2EL - TTFT) / (output_tokens - 1)        only requests with more than one output token
    ITL   = gaps between consecutive output chunks; tokens produced by the same step share a timestamp
            and count as one chunk (as a streaming client sees them), so ITL never has a spurious 0
Run:
    duration = end_time - start_time (start: the driver began sending; end: the last request finished)
    request_throughput = completed / duration, output_throughput = output tokens / duration,
    total_token_throughput = (input + output tokens) / duration
    request_goodput = requests meeting every SLO / duration (vLLM's --goodput), if any SLO is set
Latency statistics are over completed requests only (aborted and failed ones are counted, not timed): mean, median,
std and the configured percentiles (numpy's linear interpolation, as vLLM uses), in milliseconds.

Cache (from the steps table). Each step's state is the allocator's memory breakdown after it
(testbed.core.allocators.base.KVCacheStats), which partitions the cache's token slots into
    token      holding a computed token state
    reserved   held by a request for its own future tokens, up to its final length (paging: the empty
               slots of its tail block before that length; static allocators: the rest of its run)
    internal   held by a request beyond its final length, never to be filled (paging: the slots of its
               last block past its final length; static_max / static_pow2: the over-reservation)
    external   free, but in holes too small for the request blocked waiting for memory (0 for paging)
    free       free and usable (including evictable prefix-cache blocks)
kv_utilization_mean = used_blocks / num_blocks, and frag_internal / frag_reserved / frag_external =
internal / reserved / external slots over all slots, are averaged over the engine's *busy* time: each
step weighted by its duration. Time between steps is not included: the driver's own work, and in
open loop the idle waits for the next arrival (no request holds KV then); `busy_fraction` = summed
step time / run duration says how much of the run the averages cover. prefix_hit_rate = cached
prompt tokens / prompt tokens over first schedulings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")  # vLLM --goodput keys ttft / tpot / e2el, in ms
DEFAULT_PERCENTILES = (50, 90, 99)


class SLOError(ValueError):
    pass


def check_slo(slo: Mapping | None) -> dict[str, float]:
    """Validated SLOs {key: ms} with unset (null) keys dropped; unknown keys and bad values raise."""
    out = {}
    for key, value in dict(slo or {}).items():
        if key not in SLO_KEYS:
            raise SLOError(
                f"slo.{key}: unknown SLO key; valid keys are {list(SLO_KEYS)} (milliseconds, null = not checked)"
            )
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
            raise SLOError(f"slo.{key}: must be a positive number of milliseconds or null, got {value!r}")
        out[key] = float(value)
    return out


def percentile_label(p: float) -> str:
    return str(int(p)) if float(p) == int(p) else str(p)


def chunk_gaps(token_times) -> np.ndarray:
    """Inter-chunk latencies (s) of one request: gaps between distinct consecutive token timestamps."""
    t = np.asarray(token_times if token_times is not None else [], dtype=float)
    if t.size < 2:
        return np.zeros(0)
    gaps = np.diff(t)
    return gaps[gaps > 0]


def add_request_latencies(df: pd.DataFrame) -> pd.DataFrame:
    """Add ttft_ms, e2el_ms, tpot_ms (NaN where undefined) to a requests table (a copy)."""
    df = df.copy()
    df["ttft_ms"] = 1e3 * (df["first_token_time"] - df["arrival_time"])
    df["e2el_ms"] = 1e3 * (df["finish_time"] - df["arrival_time"])
    n = df["output_tokens"].astype(float)
    df["tpot_ms"] = ((df["e2el_ms"] - df["ttft_ms"]) / (n - 1)).where(n > 1)
    return df


def _stats(name: str, values_ms, percentiles) -> dict:
    v = np.asarray(values_ms, dtype=float)
    v = v[~np.isnan(v)]
    out = {}
    if v.size == 0:  # vLLM reports 0 for an empty list (np.mean([] or 0))
        v = np.zeros(1)
    out[f"mean_{name}_ms"] = float(np.mean(v))
    out[f"median_{name}_ms"] = float(np.median(v))
    out[f"std_{name}_ms"] = float(np.std(v))
    for p in percentiles:
        out[f"p{percentile_label(p)}_{name}_ms"] = float(np.percentile(v, p))
    return out


def completed_mask(requests: pd.DataFrame) -> pd.Series:
    return requests["finish_time"].notna() & ~requests["finish_reason"].isin(("abort", "error"))


def request_summary(
    requests: pd.DataFrame,
    start_time: float,
    end_time: float,
    slo: Mapping | None = None,
    percentiles=DEFAULT_PERCENTILES,
) -> dict:
    """vLLM-named request metrics: counts, throughputs, latency statistics, goodput."""
    slo = check_slo(slo)
    done = add_request_latencies(requests[completed_mask(requests)])
    duration = max(end_time - start_time, 1e-9)
    n_in, n_out = int(done["prompt_tokens"].sum()), int(done["output_tokens"].sum())
    # every request's gaps in one array, in order (no Python float per token)
    itls = np.concatenate([chunk_gaps(times) for times in done["token_times"]]) if len(done) else np.zeros(0)
    out: dict[str, float | None] = {
        "completed": len(done),
        "failed": int(len(requests) - len(done)),
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "duration": float(duration),
        "request_throughput": len(done) / duration,
        "output_throughput": n_out / duration,
        "total_token_throughput": (n_in + n_out) / duration,
    }
    if slo:
        good = np.ones(len(done), dtype=bool)
        for key, limit in slo.items():
            values = done[key].to_numpy(dtype=float)
            good &= np.nan_to_num(values, nan=0.0) <= limit  # tpot undefined (1 token): no constraint
        out["request_goodput"] = float(good.sum() / duration)
        out["slo_attainment"] = float(good.mean()) if len(done) else 0.0
    else:
        out["request_goodput"] = None
        out["slo_attainment"] = None
    out.update(_stats("ttft", done["ttft_ms"], percentiles))
    out.update(_stats("tpot", done["tpot_ms"], percentiles))
    out.update(_stats("itl", 1e3 * itls, percentiles))
    out.update(_stats("e2el", done["e2el_ms"], percentiles))
    return out


def _time_mean(steps: pd.DataFrame, column: str) -> float:
    if steps.empty or column not in steps:
        return 0.0
    w = steps["duration_s"].to_numpy(dtype=float)
    v = steps[column].to_numpy(dtype=float)
    return float(np.average(v, weights=w)) if w.sum() > 0 else float(v.mean())


def step_summary(steps: pd.DataFrame) -> dict:
    """Our own per-step aggregates: KV utilisation, fragmentation, batch shape, preemptions."""
    if steps.empty:
        return {
            "num_steps": 0,
            "kv_utilization_mean": 0.0,
            "kv_utilization_max": 0.0,
            "frag_internal": 0.0,
            "frag_reserved": 0.0,
            "frag_external": 0.0,
            "busy_s": 0.0,
            "mean_batch_size": 0.0,
            "max_batch_size": 0,
            "mean_step_time_ms": 0.0,
            "prefill_tokens": 0,
            "decode_tokens": 0,
            "max_output_tokens_per_s": 0.0,
        }
    tokens_per_s = steps["num_decode_tokens"] / steps["duration_s"].clip(lower=1e-9)
    return {
        "num_steps": len(steps),
        "kv_utilization_mean": _time_mean(steps, "kv_usage"),
        "kv_utilization_max": float(steps["kv_usage"].max()),
        "frag_internal": _time_mean(steps, "frag_internal"),
        "frag_reserved": _time_mean(steps, "frag_reserved"),
        "frag_external": _time_mean(steps, "frag_external"),
        "busy_s": float(steps["duration_s"].sum()),
        "mean_batch_size": float(steps["num_seqs"].mean()),
        "max_batch_size": int(steps["num_seqs"].max()),
        "mean_step_time_ms": 1e3 * float(steps["duration_s"].mean()),
        "prefill_tokens": int(steps["num_prefill_tokens"].sum()),
        "decode_tokens": int(steps["num_decode_tokens"].sum()),
        "max_output_tokens_per_s": float(tokens_per_s.max()),
    }


def summarize(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    start_time: float,
    end_time: float,
    slo: Mapping | None = None,
    percentiles=DEFAULT_PERCENTILES,
) -> dict:
    """The run summary: vLLM's keys first, then ours (prefix hits from the requests table)."""
    out = request_summary(requests, start_time, end_time, slo, percentiles)
    out.update(step_summary(steps))
    prompt = requests.loc[requests["first_scheduled_time"].notna(), ["prompt_tokens", "cached_tokens"]]
    out["prefix_hit_rate"] = (
        float(prompt["cached_tokens"].sum() / prompt["prompt_tokens"].sum())
        if len(prompt) and prompt["prompt_tokens"].sum()
        else 0.0
    )
    out["num_preemptions"] = int(requests["num_preemptions"].sum()) if len(requests) else 0
    out["busy_fraction"] = min(1.0, out["busy_s"] / out["duration"]) if out["duration"] > 0 else 0.0
    out["max_concurrent_requests"] = int((steps["num_running"] + steps["num_waiting"]).max()) if len(steps) else 0
    return out
