"""Real replicas: N engines in their own processes, the router in the driver, the same result files."""

import json

import pandas as pd
import pytest

from experiments.cluster.runner import run_cluster

from .helpers import cfg


def test_two_real_replicas_serve_a_trace(tmp_path):
    overrides = [
        "model=tiny",
        "cache.num_blocks=512",
        "trace=synthetic",
        "trace.num_requests=16",
        "trace.rate=40",
        "trace.prompt_len={dist:fixed,value:64}",
        "trace.output_len={dist:fixed,value:12}",
        "replay=open_loop",
        "cluster.replicas=2",
        "cluster.router=least_outstanding",
        "cluster.threads_per_replica=1",
    ]
    summary = run_cluster(cfg(*overrides), tmp_path / "real")
    requests = pd.read_parquet(tmp_path / "real" / "requests.parquet")
    steps = pd.read_parquet(tmp_path / "real" / "steps.parquet")
    assert len(requests) == 16 and requests["request_id"].is_unique
    assert (requests["finish_reason"] == "length").all() and (requests["output_tokens"] == 12).all()
    assert set(requests["replica"]) == {0, 1} and set(steps["replica"]) == {0, 1}
    # times from two processes on one monotonic clock: each request's own order holds
    assert (requests["arrival_time"] <= requests["first_scheduled_time"]).all()
    assert (requests["first_token_time"] <= requests["finish_time"]).all()
    for i in (0, 1):
        mine, work = requests[requests["replica"] == i], steps[steps["replica"] == i]
        assert work["num_prefill_tokens"].sum() == (mine["prompt_tokens"] - mine["cached_tokens"]).sum()
    on_disk = json.loads((tmp_path / "real" / "summary.json").read_text())
    assert on_disk["completed"] == summary["completed"] == 16
    assert on_disk["executor"] == "real" and on_disk["kernel"] in ("cpu", "torch")  # kernel=auto, resolved
    assert on_disk["executor"] == "real" and on_disk["cluster_mode"] == "processes"
    assert sum(on_disk["replica_requests"]) == 16


def test_real_replicas_refuse_disaggregation(tmp_path):
    with pytest.raises(ValueError, match="P/D disaggregation runs on the simulator"):
        run_cluster(cfg("model=tiny", "trace=synthetic", "cluster=pd"), tmp_path / "x")
