"""Weights & Biases logging, offline (never online in tests): config, per-step series, summary, requests."""

import json

import pytest

from experiments.run.runner import run_trace
from experiments.run.wandb_logger import resolve_mode

wandb = pytest.importorskip("wandb")


def test_mode_switches(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert resolve_mode({"enabled": False}) == "disabled"
    assert resolve_mode({"enabled": True}) == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert resolve_mode({"enabled": True}) == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode({"enabled": True}) == "disabled"
    assert resolve_mode({"enabled": True, "mode": "offline"}) == "offline"
    with pytest.raises(ValueError, match="wandb.mode"):
        resolve_mode({"enabled": True, "mode": "cloud"})


def test_offline_run_is_written(tmp_path, tiny_cfg, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_cfg(
        "trace=synthetic",
        "trace.num_requests=4",
        "trace.rate=null",
        "trace.prompt_len={dist:fixed,value:16}",
        "trace.output_len={dist:fixed,value:3}",
        "wandb.enabled=true",
        "wandb.project=testbed-tests",
    )
    summary = run_trace(cfg, tmp_path / "run")
    wandb.teardown()  # the service writes the record log asynchronously; read it once the service is done
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    log = b"".join(p.read_bytes() for p in runs[0].glob("*.wandb"))  # the run's record log (protobuf)
    for key in (
        b"max_num_seqs",  # config
        b"kv_usage",
        b"num_prefill_tokens",  # per-step series
        b"mean_ttft_ms",
        b"kv_utilization_mean",
    ):  # summary
        assert key in log, key
    tables = list(runs[0].glob("files/media/table/requests_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert "arrival_time" in table["columns"] and len(table["data"]) == 4
    assert summary["completed"] == 4


def test_disabled_by_environment(tmp_path, tiny_cfg, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = tiny_cfg(
        "trace=synthetic",
        "trace.num_requests=2",
        "trace.rate=null",
        "trace.prompt_len={dist:fixed,value:8}",
        "trace.output_len={dist:fixed,value:2}",
        "wandb.enabled=true",
    )
    run_trace(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "wandb").exists()


def test_cluster_run_logs_its_summary_and_requests(tmp_path, monkeypatch):
    from experiments.cluster.runner import run_cluster

    from ..cluster.helpers import SIM, SMALL_TRACE, cfg

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    overrides = [*SIM, *SMALL_TRACE, "cluster.replicas=2", "wandb.enabled=true", "wandb.project=testbed-tests"]
    run_cluster(cfg(*overrides), tmp_path / "run", quiet=True)
    wandb.teardown()
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    log = b"".join(p.read_bytes() for p in runs[0].glob("*.wandb"))
    assert b"replica_request_cv" in log and b"mean_ttft_ms" in log  # the cluster's summary
    tables = list(runs[0].glob("files/media/table/requests_*.table.json"))
    table = json.loads(tables[0].read_text())
    assert "replica" in table["columns"] and len(table["data"]) == 40
