"""Azure conversation trace through SmolLM2-135M, open loop: every request finishes with exactly its
(clipped) trace output length, and summary.json agrees with a recomputation from requests.parquet.

The full demonstration (first 200 requests, conf/experiment/azure_smollm2.yaml: lengths / 64, capped at
32 prompt / 8 output tokens) is marked slow; the first 40 requests, capped at 16 / 4, run by default."""

import json
import math

import pytest

from experiments.run.runner import run_trace

from .helpers import assert_summary_matches, read_run

AZURE_CSV = "experiments/data/azure_llm_2023_conv_sample.csv"


def replay_azure(tiny_cfg, run_dir, *overrides):
    cfg = tiny_cfg("experiment=azure_smollm2", "model=smollm2-135m", "cache.num_blocks=null", *overrides)
    assert cfg.model.name == "smollm2-135m" and cfg.replay.name == "open_loop"
    return run_trace(cfg, run_dir)


def check_run(run_dir, n):
    summary, requests, steps = read_run(run_dir)
    assert summary["completed"] == n == len(requests) and summary["failed"] == 0
    assert not summary["interrupted"] and not summary["timed_out"]
    assert (requests["finish_reason"] == "length").all()
    assert (requests["output_tokens"] == requests["target_output_tokens"]).all()  # EOS ignored
    assert_summary_matches(summary, requests)
    # the step table accounts for every token computed (recompute after preemption computes more)
    computed = steps["num_decode_tokens"].sum() + steps["num_prefill_tokens"].sum()
    needed = (requests["prompt_tokens"] - requests["cached_tokens"]).sum() + requests["output_tokens"].sum() - n
    assert computed == needed if summary["num_preemptions"] == 0 else computed >= needed
    report = json.loads((run_dir / "trace_report.json").read_text())
    assert report["requests"] == n and report["path"].endswith(AZURE_CSV)
    return summary, requests, report


def test_azure_first_40(tmp_path, tiny_cfg):
    run_dir = tmp_path / "run"
    # arrivals 8x faster: the ~24 s of trace clock the first 40 span become ~3 s (the checks are about lengths
    # and accounting; open loop's arrival times are test_cli's test_open_loop_replay_writes_results)
    replay_azure(
        tiny_cfg,
        run_dir,
        "trace.max_requests=40",
        "trace.time_scale=8",
        # 40 requests of <= 16 + 4 tokens: 128 MiB of KV (~2,900 token slots) instead of the default 1 GiB,
        # which the engine zeroes at start-up
        "cache.memory_gb=0.125",
        "replay.max_prompt_tokens=16",
        "replay.max_output_tokens=4",
    )
    _, requests, report = check_run(run_dir, 40)
    policy = report["replay_length_policy"]
    assert policy["max_prompt_tokens"] == 16 and policy["clipped_prompts"] > 0
    # clipped lengths follow the stated policy: ceil(trace length / 64), at least 1, capped (here 16 / 4)
    for col, cap in (("prompt", 16), ("output", 4)):
        expect = [min(cap, max(1, math.ceil(n / 64))) for n in requests[f"trace_{col}_tokens"]]
        assert requests[f"{col}_tokens"].tolist() == expect


@pytest.mark.slow
def test_azure_first_200(tmp_path, tiny_cfg):
    run_dir = tmp_path / "run"
    replay_azure(tiny_cfg, run_dir)
    summary, _, report = check_run(run_dir, 200)
    assert report["replay_length_policy"]["length_scale"] == 1 / 64
    print(
        json.dumps(
            {
                k: summary[k]
                for k in (
                    "duration",
                    "request_throughput",
                    "output_throughput",
                    "mean_ttft_ms",
                    "p99_ttft_ms",
                    "mean_tpot_ms",
                )
            },
            indent=1,
        )
    )
