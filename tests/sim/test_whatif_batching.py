"""The what-if batching sweep (SIMULATED) at a small scale: one row per configuration with an interval
over windows, and the knobs change what runs."""

import pandas as pd
import pytest

from experiments.studies import whatif_batching


def test_whatif_sweep_small(tmp_path):
    whatif_batching.main(
        [
            "--out",
            str(tmp_path),
            "--tokens",
            "512",
            "--seqs",
            "1",
            "64",
            "--windows",
            "2",
            "--requests",
            "24",
            "--time-scale",
            "20",
        ]
    )
    table = pd.read_csv(tmp_path / "whatif_batching.csv")
    runs = pd.read_csv(tmp_path / "whatif_batching_runs.csv")
    assert len(table) == 2 and (table["windows"] == 2).all() and len(runs) == 4
    for r in table.itertuples():
        assert r.request_goodput_ci_low <= r.request_goodput <= r.request_goodput_ci_high
        assert r.request_goodput <= r.request_throughput + 1e-9
    one, many = table.sort_values("max_num_seqs")["p99_ttft_ms"]
    assert one > many  # one sequence at a time queues the burst: the knob is live
    mean = runs[runs["max_num_seqs"] == 64]["slo_attainment"].mean()
    assert table[table["max_num_seqs"] == 64]["slo_attainment"].iloc[0] == pytest.approx(mean)
    assert "SIMULATED" in (tmp_path / "whatif_batching.md").read_text()
