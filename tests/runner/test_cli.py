"""run.py end to end (model=tiny): results files, sweep row, bad input, Ctrl-C, default run. Bad input and
Ctrl-C run it as a process (exit codes, stderr, signals); the others run its entry point in this process."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from .helpers import ROOT, assert_summary_matches, read_run, run_cli, run_here

SYNTH = [
    "model=tiny",
    "cache.num_blocks=1024",
    "trace=synthetic",
    "trace.num_requests=12",
    "trace.prompt_len={dist: uniform, low: 8, high: 48}",
    "trace.output_len={dist: uniform, low: 2, high: 8}",
]
VLLM_KEYS = [
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
] + [f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "std", "p99")]
OUR_KEYS = [
    "kv_utilization_mean",
    "frag_internal",
    "frag_reserved",
    "frag_external",
    "prefix_hit_rate",
    "num_preemptions",
    "p90_ttft_ms",
    "interrupted",
]


def test_open_loop_replay_writes_results(tmp_path):
    """run.py's entry point in this process (the files are what is checked; test_ctrl_c_keeps_measurements
    and test_console_script read a run.py process's files)."""
    run_dir = tmp_path / "exp" / "run1"
    log = tmp_path / "run.log"
    args = (*SYNTH, "replay=open_loop", "trace.rate=20", "progress=false", f"hydra.run.dir={run_dir}")
    assert run_here(*args, log=log) == 0, log.read_text()[-3000:]
    summary, requests, steps = read_run(run_dir)
    for key in VLLM_KEYS + OUR_KEYS:
        assert key in summary, key
    assert summary["completed"] == 12 and not summary["interrupted"]
    # trace lengths are produced exactly (EOS ignored)
    assert (requests["output_tokens"] == requests["target_output_tokens"]).all()
    for col in (
        "arrival_time",
        "first_token_time",
        "finish_time",
        "prompt_tokens",
        "output_tokens",
        "cached_tokens",
        "num_preemptions",
    ):
        assert col in requests
    # open loop: arrivals follow the trace clock exactly
    gaps = requests["arrival_time"] - requests["arrival_time"].min()
    assert gaps.to_numpy() == pytest.approx(requests["trace_arrival_s"].to_numpy(), abs=1e-9)
    assert_summary_matches(summary, requests)
    assert {"num_seqs", "num_prefill_tokens", "num_decode_tokens", "kv_usage", "frag_internal", "duration_s"} <= set(
        steps.columns
    )
    assert steps["num_prefill_tokens"].sum() + steps["num_decode_tokens"].sum() == requests[
        "prompt_tokens"
    ].sum() + requests["output_tokens"].sum() - len(requests)
    assert (run_dir / "config.yaml").read_text().count("name: synthetic") == 1
    assert json.loads((run_dir / "trace_report.json").read_text())["requests"] == 12
    sweep = pd.read_csv(tmp_path / "exp" / "sweep.csv")
    assert len(sweep) == 1 and sweep.loc[0, "run_dir"] == "run1" and sweep.loc[0, "replay.name"] == "open_loop"
    assert sweep.loc[0, "completed"] == 12


def test_bad_input_is_a_clear_error(tmp_path):
    """The CLI path of an input error (the cases themselves are in test_runner_errors.py)."""
    proc = run_cli(
        "model=tiny",
        "cache.num_blocks=64",  # the engine is built before the trace is read; no 1 GiB default KV to zero
        "trace=azure",
        "trace.path=/nonexistent/azure.csv",
        f"hydra.run.dir={tmp_path}/r",
        check=False,
    )
    assert proc.returncode != 0
    assert "/nonexistent/azure.csv: file not found" in proc.stderr, proc.stderr[-3000:]


def test_ctrl_c_keeps_measurements(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        str(ROOT / "run.py"),
        *SYNTH,
        "trace.num_requests=2000",
        "replay=open_loop",
        "trace.rate=20",
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    # wait until a few requests finished (the progress bar counts them), then press Ctrl-C
    deadline, seen = time.monotonic() + 300, ""
    while time.monotonic() < deadline and proc.poll() is None:
        seen += proc.stderr.read(1)
        done = re.findall(r"(\d+)/2000 \[", seen[-200:])
        if done and int(done[-1]) >= 3:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (seen + err)[-3000:]
    summary, requests, steps = read_run(run_dir)
    assert summary["interrupted"] is True
    assert 3 <= summary["completed"] < 2000 and len(steps) > 0
    assert set(requests["finish_reason"]) <= {"length", "abort"}
    assert summary["completed"] == (requests["finish_reason"] == "length").sum()
    assert_summary_matches(summary, requests)
    assert len(pd.read_csv(tmp_path / "sweep.csv")) == 1


def test_default_run_prints_a_summary(tmp_path):
    """`python run.py` (the built-in prompt set on smollm2-135m), made small: the KV budget too (still sized
    from cache.memory_gb, as by default; 1/16 of the default 1 GiB that the 3 prompts never use, which costs
    seconds to zero and fault in on huge pages). run.py's entry point in this process: the tests above and
    test_console_script.py run it as a process; a process of its own here would only load torch, transformers
    and the tokenizer once more."""
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    args = ("workload.num_prompts=3", "workload.max_tokens=4", "cache.memory_gb=0.0625", "progress=false")
    assert run_here(*args, f"hydra.run.dir={tmp_path}/run", log=out, err=err) == 0, err.read_text()[-3000:]
    stdout = out.read_text()
    for text in ("requests completed", "3 / 3", "output throughput", "tok/s", "TTFT", "first answer"):
        assert text in stdout, stdout
    summary, _, _ = read_run(tmp_path / "run")
    assert summary["completed"] == 3 and summary["replay"] == "offline"
    assert json.loads((tmp_path / "run" / "samples.json").read_text())[0]["answer"]
