"""benchmarks.sim_speed: runs a small replay through the runner and reports what it ran."""

import json

import pytest

from benchmarks.sim_speed import main

SAMPLE = "experiments/data/azure_llm_2023_conv_sample.csv"


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("log", [True, False])
def test_sim_speed_reports_the_run_and_its_access_log_switch(tmp_path, monkeypatch, log):
    from experiments.run import runner

    seen = {}
    run_trace = runner.run_trace

    def spy(cfg, out):
        seen[str(out)] = bool(cfg.metrics.kv_access_log)
        summary = run_trace(cfg, out)
        seen[str(out) + ":files"] = sorted(p.name for p in out.iterdir())
        return summary

    monkeypatch.setattr(runner, "run_trace", spy)
    main(["--requests", "30", "--profile-requests", "10", "--trace-path", SAMPLE, "--out", str(tmp_path),
          "--kv-access-log", str(log).lower()])  # fmt: skip
    result = json.loads((tmp_path / "sim_speed.json").read_text())
    assert result["requests"] == 30 and result["steps"] > 0 and result["wall_s"] > 0
    assert [v for k, v in seen.items() if not k.endswith(":files")] == [log, log]
    assert all(("kv_accesses.parquet" in v) == log for k, v in seen.items() if k.endswith(":files"))
    assert f"metrics.kv_access_log={str(log).lower()}" in (tmp_path / "sim_speed.md").read_text()
