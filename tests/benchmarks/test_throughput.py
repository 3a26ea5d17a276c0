"""The throughput benchmark end to end on a tiny model (every system in its own process; its main in this
process, whose own process would only add a start-up), and its roofline math."""

import json

from benchmarks.report import paired_rounds
from benchmarks.roofline import fastest_device, workload_bound
from benchmarks.throughput import main
from experiments.statistics.intervals import t_interval


def test_roofline_bound_by_hand():
    numbers = {
        "layers": 2,
        "heads": 4,
        "head_dim": 16,
        "lm_head_params": 1000,
        "body_params": 5000,
        "step_weight_bytes": 24000,
        "kv_bytes_per_token": 256,
    }
    prompts, outputs = [[0] * 10, [0] * 4], [3, 2]
    b = workload_bound(prompts, outputs, numbers, max_batch=8, bandwidth=1e6, flops_rate=1e6)
    assert b["min_forwards"] == 3  # the longest output
    kv_reads = (2 * 10 + 1 + 2) + (1 * 4 + 0 + 1)  # sum over decode tokens of their context
    assert b["bytes"] == 3 * 24000 + kv_reads * 256
    pairs = 10 * 11 // 2 + 4 * 5 // 2 + kv_reads
    assert b["flops"] == 2 * 5000 * (12 + 5) + 2 * 1000 * 5 + 4 * 2 * 4 * 16 * pairs
    assert b["bound_s"] == max(b["t_memory_s"], b["t_compute_s"])


def test_fastest_device_takes_the_best_rates():
    runs = [
        {"bandwidth_Bps": 30e9, "flops_per_s": 2.1e11, "matmul": "m"},
        {"error": "timed out"},
        {"bandwidth_Bps": 20e9, "flops_per_s": 2.4e11, "matmul": "m"},
    ]
    best = fastest_device(runs)
    assert (best["bandwidth_Bps"], best["flops_per_s"]) == (30e9, 2.4e11)  # each rate's best, across runs
    assert best["measurements"] == 2 and best["flops_range"] == [2.1e11, 2.4e11]
    assert fastest_device([{"error": "x"}]) == {"error": "x"} and fastest_device([]) == {}


def test_paired_rounds_sets_each_run_against_its_own_round():
    all_runs = {
        "engine-cpu": [{"run": 1, "output_tok_s": 100.0}, {"run": 2, "output_tok_s": 120.0}],
        "hf-static (batch 32)": [{"run": 1, "output_tok_s": 40.0}, {"run": 2, "output_tok_s": 30.0}],
        "hf-static (batch 8)": [{"run": 1, "output_tok_s": 20.0}, {"run": 2, "error": "timed out"}],
    }
    lines = paired_rounds(all_runs, [{"bound_output_tok_s": 200.0}, {"bound_output_tok_s": 150.0}])
    engine = next(line for line in lines if line.startswith("- engine-cpu"))
    # the best hf-static batch size (32) of the same round, and that round's roofline
    assert "run 1 50% of roofline, 2.50x hf-static (batch 32)" in engine
    assert "run 2 80% of roofline, 4.00x hf-static (batch 32)" in engine
    assert not any("batch 8): run 2" in line for line in lines)  # a failed run is left out
    # the mean over rounds with its t interval: 65% +- t(0.975, 1) * 15 / sqrt(2)
    low, high = t_interval([50.0, 80.0])
    assert f"**mean 65.0% of roofline** (95% CI {low:.1f}% to {high:.1f}%, 2 runs)" in engine
    assert "**mean 3.25x hf-static (batch 32)**" in engine
    assert paired_rounds({"engine-cpu": [{"run": 1, "output_tok_s": 1.0}]}, [None]) == []


def test_benchmark_runs_every_system(tmp_path, keep_torch_threads):
    args = [
        "--preset",
        "cpu",
        "--model",
        "tiny",
        "--num-requests",
        "3",
        "--systems",
        "engine-cpu",
        "engine-torch",
        "hf-static",
        "--hf-batch-sizes",
        "2",
        "--threads",
        "1",
        "--kv-cache-memory-gb",  # each engine zeroes its KV budget at start-up (default 2 GiB)
        "0.0625",
        "--out",
        str(tmp_path),
        "--name",
        "smoke",
    ]
    assert main(args) == 0
    result = json.loads((tmp_path / "smoke.json").read_text())
    rows = {r["system"]: r for r in result["results"]}
    assert set(rows) == {"engine-cpu", "engine-torch", "hf-static (batch 2)"}
    for r in rows.values():
        assert "error" not in r and r["output_tok_s"] > 0
    # every system produced exactly the workload's output lengths (EOS ignored)
    assert len({r["output_tokens"] for r in rows.values()}) == 1
    table = (tmp_path / "smoke.md").read_text()
    assert "| engine-cpu |" in table and "Roofline bound" in table
    assert len(result["device_runs"]) == 1 and result["device_measured"]["measurements"] == 1
