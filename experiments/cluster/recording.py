"""What a cluster run records: the single-engine tables plus where each request ran, and the summary's
cluster keys (load balance, prefix hits and goodput per replica, KV transfers).

requests.parquet gains `replica` (where the request finished: its only replica, or its decode replica)
and, with P/D disaggregation, `prefill_replica`, `prefill_finish_time`, `transfer_start_time`,
`transfer_end_time`, `kv_transfer_bytes` and `kv_transfer_s`. For a disaggregated request,
first_scheduled_time, cached_tokens and num_preemptions are its prefill replica's (where its prompt was
computed; preemptions add up both sides), the token times its decode replica's.
steps.parquet gains `replica` and `role`: one row per step of every replica, in the order they started
(start time, then replica, then step: the same order whether a simulated replica stepped one by one or
skipped decode steps, testbed.sim.decode_runs).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.results.metrics import request_summary
from experiments.results.recorder import REQUEST_COLUMNS, Recorder, requests_frame

PD_COLUMNS = [
    "prefill_replica",
    "prefill_finish_time",
    "transfer_start_time",
    "transfer_end_time",
    "kv_transfer_bytes",
    "kv_transfer_s",
]


class ClusterRecorder(Recorder):
    def __init__(self, roles: list[str], disaggregated: bool = False):
        super().__init__()
        self.roles = roles
        self.disaggregated = disaggregated

    # ---- steps: every replica's engine, tagged ------------------------------------------------------
    def attach_all(self, engines) -> ClusterRecorder:
        self._callbacks = []
        for index, engine in enumerate(engines):
            callback = self._step_callback(index)
            engine.step_callbacks.append(callback)
            self._callbacks.append((engine, callback))
        return self

    def _step_callback(self, index: int):
        role = self.roles[index]

        def on_step(stats):
            self.on_step(stats)
            self.steps[-1]["replica"] = index
            self.steps[-1]["role"] = role

        return on_step

    def detach(self) -> None:
        for engine, callback in getattr(self, "_callbacks", []):
            if callback in engine.step_callbacks:
                engine.step_callbacks.remove(callback)
        self._callbacks = []

    def steps_frame(self) -> pd.DataFrame:
        steps = super().steps_frame()
        if steps.empty or "replica" not in steps:
            return steps
        return steps.sort_values(["start_time", "replica", "step"], kind="stable").reset_index(drop=True)

    def add_step_rows(self, index: int, rows: list[dict]) -> None:
        """Step rows recorded elsewhere (a replica process)."""
        for row in rows:
            self.steps.append({**row, "replica": index, "role": self.roles[index]})

    # ---- requests ---------------------------------------------------------------------------------
    def on_add(self, spec, arrival_time: float, replica: int | None = None) -> None:
        super().on_add(spec, arrival_time)
        row = self.requests[spec.request_id]
        if self.disaggregated:
            row.update(dict.fromkeys(PD_COLUMNS), replica=None, prefill_replica=replica)
        else:
            row["replica"] = replica

    def on_delivered(self, delivered) -> None:
        """A finished request (testbed.cluster.simulated.Delivered, or a process replica's equivalent)."""
        self.on_output(delivered.output)
        row = self.requests.get(delivered.output.request_id)
        if row is None:
            return
        row["replica"] = delivered.replica
        handoff = getattr(delivered, "handoff", None)
        if handoff is not None:  # disaggregated: the prompt was computed on the prefill replica
            row.update(handoff.columns())
            row["num_preemptions"] += handoff.prefill_preemptions

    def columns(self) -> list[str]:
        return REQUEST_COLUMNS + ["replica"] + (PD_COLUMNS if self.disaggregated else [])

    def requests_frame(self) -> pd.DataFrame:
        df = requests_frame(self.requests.values(), self.columns())
        for col in ("replica", "prefill_replica"):
            if col in df:
                df[col] = df[col].astype("Int64")
        for col in PD_COLUMNS[1:]:
            if col in df:
                df[col] = df[col].astype(float)
        return df


def on_replica(requests: pd.DataFrame, column: str, index: int) -> pd.Series:
    """Rows whose `column` is `index` (a request that never reached that side has NA there)."""
    return (requests[column] == index).fillna(False).astype(bool)


def coefficient_of_variation(values) -> float:
    """std / mean (population std), 0 for an all-zero list."""
    v = np.asarray(values, dtype=float)
    return float(v.std() / v.mean()) if len(v) and v.mean() > 0 else 0.0


def concurrent_requests(requests: pd.DataFrame) -> int:
    """Most requests in the cluster at once (arrived, not finished), from the requests table."""
    done = requests[requests["finish_time"].notna()]
    if done.empty:
        return 0
    times = np.concatenate([done["arrival_time"].to_numpy(), done["finish_time"].to_numpy()])
    deltas = np.concatenate([np.ones(len(done)), -np.ones(len(done))])
    order = np.lexsort((deltas, times))  # at equal times a departure (-1) counts before an arrival
    return int(np.cumsum(deltas[order]).max())


def cluster_summary(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    start_time: float,
    end_time: float,
    roles: list[str],
    slo: dict,
    percentiles,
) -> dict:
    """The cluster keys of summary.json (lists are per replica, in index order):

    replica_requests / replica_tokens: requests each replica served (finished there, or for a prefill
    replica prefilled there) / tokens each computed
    (prefill + decode, from its steps); replica_request_cv / replica_token_cv: their coefficients of
    variation (std / mean; 0 is perfect balance) over the replicas that finish requests (all of them, or
    the decode replicas with P/D; then prefill_request_cv / prefill_token_cv cover the prefill replicas,
    counting requests by where they were prefilled); cluster_prefix_hit_rate: cached prompt tokens
    / prompt tokens over the cluster (the prefill side when disaggregated); replica_prefix_hit_rate and
    replica_goodput (its requests meeting every SLO / run duration) per replica; max_concurrent_requests:
    across the whole cluster."""
    n = len(roles)
    # a replica's requests: those that finished there, or for a prefill replica those prefilled there
    served = [
        on_replica(requests, "prefill_replica" if role == "prefill" else "replica", i) for i, role in enumerate(roles)
    ]
    per_request = [int(mask.sum()) for mask in served]
    tokens = [0] * n
    if len(steps):
        work = (steps["num_prefill_tokens"] + steps["num_decode_tokens"]).groupby(steps["replica"]).sum()
        tokens = [int(work.get(i, 0)) for i in range(n)]
    finishing = [i for i, role in enumerate(roles) if role != "prefill"]
    prompt_side = "prefill_replica" if "prefill_replica" in requests else "replica"
    scheduled = requests[requests["first_scheduled_time"].notna()]
    hit_rates, goodput = [], []
    for i in range(n):
        mine = scheduled[on_replica(scheduled, prompt_side, i)]
        prompt = mine["prompt_tokens"].sum()
        hit_rates.append(float(mine["cached_tokens"].sum() / prompt) if prompt else 0.0)
        goodput.append(request_summary(requests[served[i]], start_time, end_time, slo, percentiles)["request_goodput"])
    prompt_total = scheduled["prompt_tokens"].sum()
    out = {
        "cluster_replicas": n,
        "replica_roles": list(roles),
        "replica_requests": per_request,
        "replica_tokens": tokens,
        "replica_request_cv": coefficient_of_variation([per_request[i] for i in finishing]),
        "replica_token_cv": coefficient_of_variation([tokens[i] for i in finishing]),
        "cluster_prefix_hit_rate": float(scheduled["cached_tokens"].sum() / prompt_total) if prompt_total else 0.0,
        "replica_prefix_hit_rate": hit_rates,
        "replica_goodput": goodput,
        "max_concurrent_requests": concurrent_requests(requests),
    }
    prefill = [i for i, role in enumerate(roles) if role == "prefill"]
    if prefill:
        out["prefill_request_cv"] = coefficient_of_variation([per_request[i] for i in prefill])
        out["prefill_token_cv"] = coefficient_of_variation([tokens[i] for i in prefill])
    if "kv_transfer_bytes" in requests:
        moved = requests[requests["transfer_end_time"].notna()]
        waited = moved["transfer_start_time"] - moved["prefill_finish_time"]
        out.update(
            {
                "kv_transfers": len(moved),
                "kv_transfer_bytes_total": int(moved["kv_transfer_bytes"].sum()),
                "mean_kv_transfer_ms": 1e3 * float(moved["kv_transfer_s"].mean()) if len(moved) else 0.0,
                "p99_kv_transfer_ms": 1e3 * float(np.percentile(moved["kv_transfer_s"], 99)) if len(moved) else 0.0,
                "mean_kv_transfer_wait_ms": 1e3 * float(waited.mean()) if len(moved) else 0.0,
            }
        )
    return out
