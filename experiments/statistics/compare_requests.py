"""Request by request: which requests two runs share, whether they ran the same workload, and why the
latency of the ones that changed most changed (experiments.statistics.compare)."""

from __future__ import annotations

import pandas as pd

from experiments.results.metrics import add_request_latencies, completed_mask

LATENCY = ("ttft", "tpot", "e2el")  # per request, lower is better
# what fixes a request of the workload: the same id with the same arrival and lengths is the same request
WORKLOAD_COLUMNS = ("trace_arrival_s", "prompt_tokens", "target_output_tokens")


def same_workload(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Whether two runs' requests tables hold the same requests (ids, trace arrivals, lengths)."""
    cols = [c for c in WORKLOAD_COLUMNS if c in a and c in b]
    if len(a) != len(b) or set(a["request_id"]) != set(b["request_id"]):
        return False
    ja, jb = a.set_index("request_id")[cols], b.set_index("request_id")[cols]
    return bool((ja.sort_index().to_numpy() == jb.sort_index().to_numpy()).all())


def _counts(steps: pd.DataFrame, column: str) -> pd.Series:
    if column not in steps or steps.empty:
        return pd.Series(dtype=float)
    return steps[column].explode().dropna().value_counts()


def request_table(requests: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Completed requests with latencies (ms) and what happened to them."""
    req = add_request_latencies(requests[completed_mask(requests)])
    req = req.set_index("request_id")
    out = req[[f"{m}_ms" for m in LATENCY] + ["num_preemptions"]].copy()
    out["queue_ms"] = 1e3 * (req["first_scheduled_time"] - req["arrival_time"])
    out["prefill_chunks"] = _counts(steps, "prefill_ids").reindex(out.index)
    out["scheduled_steps"] = _counts(steps, "scheduled_ids").reindex(out.index)
    return out


def paired_requests(pairs) -> pd.DataFrame:
    """Per pair of runs (objects with .requests, .steps, .repeat), the requests completed in both, joined."""
    frames = []
    for pair, (ra, rb) in enumerate(pairs):
        ta, tb = request_table(ra.requests, ra.steps), request_table(rb.requests, rb.steps)
        joined = ta.merge(tb, how="inner", left_index=True, right_index=True, suffixes=("_a", "_b"))
        joined.insert(0, "pair", pair)
        joined.insert(1, "repeat", ra.repeat)
        frames.append(joined.reset_index())
    return pd.concat(frames, ignore_index=True)


def explain(req: pd.DataFrame, top: int, metric: str = "e2el") -> pd.DataFrame:
    """The `top` request pairs whose `metric` changed most, with the differences that explain it."""
    if top <= 0 or req.empty:
        return pd.DataFrame()
    delta = (req[f"{metric}_ms_b"] - req[f"{metric}_ms_a"]).abs()
    rows = []
    for i in delta.nlargest(top).index:
        r = req.loc[i]
        reasons = []
        dq = r["queue_ms_b"] - r["queue_ms_a"]
        if abs(dq) >= 1:
            reasons.append(f"queueing {r['queue_ms_a']:.0f} -> {r['queue_ms_b']:.0f} ms")
        if r["num_preemptions_a"] != r["num_preemptions_b"]:
            reasons.append(f"preemptions {int(r['num_preemptions_a'])} -> {int(r['num_preemptions_b'])}")
        for col, what in (("prefill_chunks", "prefill chunks"), ("scheduled_steps", "steps scheduled")):
            ca, cb = r.get(f"{col}_a"), r.get(f"{col}_b")
            if pd.notna(ca) and pd.notna(cb) and ca != cb:
                reasons.append(f"{what} {int(ca)} -> {int(cb)}")
        rows.append(
            {
                "request_id": r["request_id"],
                "repeat": int(r["repeat"]),
                "metric": metric,
                "a_ms": r[f"{metric}_ms_a"],
                "b_ms": r[f"{metric}_ms_b"],
                "queue_ms_a": r["queue_ms_a"],
                "queue_ms_b": r["queue_ms_b"],
                "preemptions_a": r["num_preemptions_a"],
                "preemptions_b": r["num_preemptions_b"],
                "prefill_chunks_a": r.get("prefill_chunks_a"),
                "prefill_chunks_b": r.get("prefill_chunks_b"),
                "why": "; ".join(reasons) or "same queueing, preemptions and chunks: slower steps",
            }
        )
    return pd.DataFrame(rows)
