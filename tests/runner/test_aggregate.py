"""experiments.statistics.aggregate: repeats grouped by configuration into mean and 95% intervals next to sweep.csv;
`replay.repeats=N` and seed sweeps record what it needs."""

import json

import pandas as pd
import pytest

from experiments.run.repeats import repeat_configs
from experiments.run.runner import run_trace
from experiments.statistics.aggregate import AggregateCallback, wide, write_aggregate
from experiments.statistics.compare import compare

from .fake_runs import write_run, write_sweep
from .helpers import run_cli
from .test_sweep import SMALL


def test_aggregate_groups_repeats_and_bounds_the_mean(tmp_path):
    write_sweep(tmp_path, 3, first_seed=1, config_id="fcfs")
    write_sweep(tmp_path, 3, first_seed=7, config_id="sjf", ttft_scale=2.0)
    agg = pd.read_csv(write_aggregate(tmp_path))
    assert set(agg["config_id"]) == {"fcfs", "sjf"} and (agg["n"] == 3).all()
    table = pd.read_csv(tmp_path / "sweep.csv")
    for (cfg, metric), row in agg.set_index(["config_id", "metric"]).iterrows():
        values = table.loc[table["config_id"] == cfg, metric]
        assert row["mean"] == pytest.approx(values.mean()), metric
        assert row["ci_low"] <= row["mean"] <= row["ci_high"], (cfg, metric)
    rows = agg.set_index(["config_id", "metric"])
    assert rows.loc[("fcfs", "p99_ttft_ms"), "method"] == rows.loc[("fcfs", "output_throughput"), "method"] == "t"
    assert rows.loc[("sjf", "p50_ttft_ms"), "ci_low"] > rows.loc[("fcfs", "p50_ttft_ms"), "ci_high"]  # 2x apart
    w = wide(agg, ["p99_ttft_ms"]).set_index("config_id")
    assert {"p99_ttft_ms", "p99_ttft_ms_ci_low", "p99_ttft_ms_ci_high", "n"} <= set(w.columns)


def test_intervals_stay_within_what_the_metric_can_take():
    """An SLO attainment of 1, 1, 0.8 has a t interval past 1 and a short latency one below 0: both are cut
    to the metric's range, where the true value lies, so the cut interval covers it exactly as often."""
    import numpy as np

    from experiments.statistics.aggregate import interval
    from experiments.statistics.intervals import t_interval

    shares = np.array([1.0, 1.0, 0.8])
    assert t_interval(shares, 0.95)[1] > 1
    share = interval("slo_attainment", shares, None)
    assert share["ci_high"] == 1.0 and share["ci_low"] == pytest.approx(t_interval(shares, 0.95)[0])
    times = np.array([0.1, 0.1, 5.0])
    assert t_interval(times, 0.95)[0] < 0
    assert interval("mean_ttft_ms", times, None)["ci_low"] == 0.0
    assert interval("prefix_hit_rate", np.array([0.0, 0.0, 0.3]), None)["ci_low"] == 0.0
    unbounded = np.array([-1.0, 1.0, 3.0])
    assert interval("some_difference", unbounded, None)["ci_low"] == pytest.approx(t_interval(unbounded, 0.95)[0])


def test_one_run_gets_order_statistic_intervals_or_says_why_not(tmp_path):
    """A single run: latency percentiles get the distribution-free interval from its requests, or a note
    when there are too few of them; run-level metrics and ITL percentiles get none, with the reason."""
    table = tmp_path / "sweep.csv"
    write_run(tmp_path / "big", seed=1, config_id="big", table=table)
    write_run(tmp_path / "small", seed=2, config_id="small", table=table, n_requests=40)
    rows = pd.read_csv(write_aggregate(tmp_path)).set_index(["config_id", "metric"])
    requests = pd.read_parquet(tmp_path / "big" / "requests.parquet")
    ttft = 1e3 * (requests["first_token_time"] - requests["arrival_time"])
    big = rows.loc[("big", "p99_ttft_ms")]
    assert big["method"] == "order statistic" and big["ci_low"] < big["mean"] < big["ci_high"]
    assert (ttft > big["ci_high"]).sum() <= 2 and (ttft < big["ci_low"]).sum() >= 390  # near the top of 400
    small = rows.loc[("small", "p99_ttft_ms")]
    assert pd.isna(small["ci_low"])
    assert small["note"] == "n too small for a p99 interval (40 requests; 368 needed at 95%)"
    assert rows.loc[("small", "p90_ttft_ms"), "method"] == "order statistic"  # 36 requests suffice for p90
    assert "shared by its batch" in rows.loc[("big", "p99_itl_ms"), "note"]
    assert rows.loc[("big", "output_throughput"), "note"].startswith("one run: no interval")


def test_repeat_configs_offset_the_seed_keys(tiny_cfg):
    cfgs = repeat_configs(tiny_cfg("trace=synthetic", "seed=5", "replay.repeat_seeds=[seed,trace.seed]"), 3)
    assert [(c.replay.repeat, c.seed, c.trace.seed) for c in cfgs] == [(0, 5, 0), (1, 6, 1), (2, 7, 2)]
    with pytest.raises(ValueError, match="repeat_seeds"):
        repeat_configs(tiny_cfg("replay.repeat_seeds=[model]"), 2)
    with pytest.raises(ValueError, match="replay.repeats"):
        run_trace(tiny_cfg("trace=synthetic", "replay.repeats=0"), "/nonexistent")


def test_replay_repeats_end_to_end(tiny_cfg, tmp_path):
    """replay.repeats=2 on the tiny model: two run folders with their repeat index and seed, one config_id,
    sweep_ci.csv next to sweep.csv, steps that say who ran, and compare() over the two repeats."""
    run = tmp_path / "run"
    small = [o for o in SMALL if not o.startswith(("model=", "cache.num_blocks"))]
    out = run_trace(tiny_cfg(*small, "replay=offline", "replay.repeats=2"), run)
    assert out["repeats"] == 2 and out["sweep_ci"] == run / "sweep_ci.csv"
    table = pd.read_csv(run / "sweep.csv")  # the run folder's own table...
    assert list(table["repeat"]) == [0, 1] and list(table["seed"]) == [0, 1]
    assert table["config_id"].nunique() == 1 and list(table["run_dir"]) == ["repeat0", "repeat1"]
    assert list(table["redraw_workload"]) == [False, False]  # the real engine's default
    outer = pd.read_csv(tmp_path / "sweep.csv")  # ...and the rows in the folder above, as a single run's
    assert list(outer["run_dir"]) == ["run/repeat0", "run/repeat1"] and not (tmp_path / "sweep_ci.csv").exists()
    for i in range(2):
        summary = json.loads((run / f"repeat{i}" / "summary.json").read_text())
        assert (summary["repeat"], summary["seed"]) == (i, i)
        assert f"repeat: {i}" in (run / f"repeat{i}" / "config.yaml").read_text()
    steps = pd.read_parquet(run / "repeat0" / "steps.parquet")
    scheduled = {rid for ids in steps["scheduled_ids"] for rid in ids}
    prefilled = {rid for ids in steps["prefill_ids"] for rid in ids}
    assert len(scheduled) == 6 and prefilled == scheduled  # every request prefilled at least once
    assert all(len(ids) == len(n) for ids, n in zip(steps["scheduled_ids"], steps["scheduled_tokens"]))
    assert sum(len(ids) for ids in steps["prefill_ids"]) >= 6 and not any(len(p) for p in steps["preempted_ids"])
    agg = pd.read_csv(run / "sweep_ci.csv")
    assert (agg["n"] == 2).all() and "p99_ttft_ms" in set(agg["metric"])
    result = compare(run / "repeat0", run / "repeat1", n_resamples=200)
    assert result.requests == 6 and len(result.table) == 12  # 9 latency statistics, 3 run metrics


def test_callback_writes_the_intervals_when_a_multirun_ends(tmp_path):
    from omegaconf import OmegaConf

    write_sweep(tmp_path, 2, first_seed=1)
    config = OmegaConf.create({"results": {"sweep_table": None}, "hydra": {"sweep": {"dir": str(tmp_path)}}})
    AggregateCallback().on_multirun_end(config)
    assert (pd.read_csv(tmp_path / "sweep_ci.csv")["n"] == 2).all()
    AggregateCallback().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "none")}}}))


@pytest.mark.slow
def test_seed_sweep_is_aggregated_when_the_multirun_ends(tmp_path):
    run_cli("-m", *SMALL, "seed=0,1", f"hydra.sweep.dir={tmp_path}")
    agg = pd.read_csv(tmp_path / "sweep_ci.csv")
    assert agg["config_id"].nunique() == 1 and (agg["n"] == 2).all()
