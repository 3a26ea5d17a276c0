"""The cluster studies' arithmetic and the speed benchmark's plumbing (small and fast)."""

import json
import math

import pandas as pd
import pytest

from experiments.studies.cluster_disagg import capacities, rate_at_goal
from experiments.studies.cluster_runs import RunTable, ci95


def test_rate_at_goal_interpolates_where_attainment_crosses_90_percent():
    assert rate_at_goal([10, 20, 30], [1.0, 0.95, 0.75]) == pytest.approx(20 + 0.05 / 0.2 * 10)
    assert rate_at_goal([30, 10, 20], [0.75, 1.0, 0.95]) == pytest.approx(22.5)  # order of the sweep irrelevant
    assert rate_at_goal([10, 20], [0.5, 0.4]) == 0.0  # misses at the lowest rate
    assert rate_at_goal([10, 20], [1.0, 0.91]) == 20.0  # never misses: the sweep's top
    assert rate_at_goal([10, 20, 30], [0.95, 0.85, 0.99]) == pytest.approx(15.0)  # the first crossing counts


def test_capacities_average_per_seed_rates():
    runs = pd.DataFrame(
        {
            "workload": "w",
            "config": "c",
            "seed": [0, 0, 1, 1],
            "rate": [10, 20, 10, 20],
            "slo_attainment": [1.0, 0.8, 1.0, 1.0],
        }  # fmt: skip
    )
    (row,) = capacities(runs, ["workload", "config"]).to_dict("records")
    assert row["goodput_rps"] == pytest.approx((15 + 20) / 2) and row["seeds"] == 2 and not row["above_sweep"]


def test_ci95_is_a_t_interval():
    mean, half = ci95([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-5)
    assert math.isnan(ci95([5.0])[1]) and math.isnan(ci95([])[0])


def test_run_table_resumes(tmp_path):
    table = RunTable(tmp_path / "runs.csv", ["a", "b"])
    table.add({"a": 1, "b": "x", "v": 0.5})
    again = RunTable(tmp_path / "runs.csv", ["a", "b"])
    assert again.done({"a": 1, "b": "x"}) and not again.done({"a": 2, "b": "x"})


@pytest.mark.usefixtures("one_torch_thread")
def test_cluster_speed_benchmark_runs_and_reports(tmp_path):
    from benchmarks.cluster_speed import main

    main(["--requests", "40", "--replicas", "2", "--profile-requests", "10", "--out", str(tmp_path),
          "--trace-path", "experiments/data/azure_llm_2023_conv_sample.csv"])  # fmt: skip
    result = json.loads((tmp_path / "speed.json").read_text())
    assert result["requests"] == 40 and result["replicas"] == 2 and result["steps"] > 0
    assert "SIMULATED" in (tmp_path / "speed.md").read_text()
