"""benchmarks.pool_rounds: rounds of several throughput runs pooled, each against its own round's bound."""

from pathlib import Path

import pytest

from benchmarks.pool_rounds import main, pool
from benchmarks.roofline import workload_bound

ROOT = Path(__file__).resolve().parents[2]


def _result(engine: list[float], static: list[float], flops_rates: list[float]) -> dict:
    numbers = {"step_weight_bytes": 1e9, "kv_bytes_per_token": 1e3, "layers": 2, "heads": 2, "head_dim": 8,
               "body_params": 1e8, "lm_head_params": 1e7}  # fmt: skip
    prompts, outputs = [[0] * 100] * 4, [10] * 4
    devices = [{"bandwidth_Bps": 2e10, "flops_per_s": f} for f in flops_rates]
    return {
        "roofline": workload_bound(prompts, outputs, numbers, 4, 2e10, max(flops_rates)),
        "device_runs": devices,
        "all_runs": {
            "engine-cpu": [{"run": i + 1, "output_tok_s": v} for i, v in enumerate(engine)],
            "hf-static (batch 32)": [{"run": i + 1, "output_tok_s": v} for i, v in enumerate(static)],
        },
        # each round's bound straight from workload_bound, to check pool's reconstruction against
        "_bounds": [
            workload_bound(prompts, outputs, numbers, 4, d["bandwidth_Bps"], d["flops_per_s"]) for d in devices
        ],
    }


def test_each_pooled_round_keeps_its_own_bound_and_partner():
    a = _result([100.0, 120.0], [40.0, 30.0], [2e11, 1e11])
    b = _result([90.0], [45.0], [1.5e11])
    all_runs, bounds = pool([a, b])
    assert [r["run"] for r in all_runs["engine-cpu"]] == [1, 2, 3]  # renumbered across files
    expected = [x["bound_output_tok_s"] for x in a["_bounds"] + b["_bounds"]]
    assert [x["bound_output_tok_s"] for x in bounds] == pytest.approx(expected)
    assert bounds[0]["bound_output_tok_s"] != bounds[1]["bound_output_tok_s"]  # the round's rate, not the best


def test_files_of_different_workloads_are_refused():
    a, b = _result([100.0], [40.0], [2e11]), _result([100.0], [40.0], [2e11])
    b["roofline"] = dict(b["roofline"], flops=b["roofline"]["flops"] * 2)
    with pytest.raises(ValueError, match="different workloads"):
        pool([a, b])


def test_one_committed_run_pools_to_its_own_report(capsys):
    path = ROOT / "results" / "throughput" / "cpu-smollm2-135m-xeon.json"
    if not path.exists():
        pytest.skip("no committed cpu-preset result")
    assert main([str(path)]) == 0
    engine = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("- engine-cpu"))
    assert engine in path.with_suffix(".md").read_text()  # same pairs, same mean and interval
