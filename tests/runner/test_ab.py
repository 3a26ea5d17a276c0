"""experiments.run.ab, as a researcher runs it: two configurations alternately (warm-ups A B, then pairs AB BA
AB ...), each run its own run.py process, into two repeated-run folders that experiments.statistics.compare reads.

Identical sides on the simulator: identical pairs, no difference. A planted difference on the host executor
(no model; each step holds the "device" for executor.step_time_s, timed by this machine's clock): steps
10% longer on B, found at 5 pairs; the runs' own clock readings show the sides interleaved, so compare
does not call them sequential.

Those two tests run each child as run.py's own entry point in this process (`runs_here`): they are about the
schedule, the folders, the seeds and the comparison, and a run.py process would only start Python, torch
and Hydra once more per run. The Ctrl-C test runs the real thing, the runner as a command and every run its
own run.py process (signals, exit codes, the child's command line and environment)."""

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from experiments.run.ab import Runner, Slot, main, schedule

from .helpers import ROOT, run_here

SIM = [
    "executor=sim",
    "device=h100-sxm",
    "model=tiny",
    "kernel=torch",
    "cache.num_blocks=256",  # the tiny model on an H100 would get millions of blocks
    "trace=synthetic",
    "trace.num_requests=10",
    "trace.rate=2",
    "trace.prompt_len={dist:fixed,value:16}",
    "trace.output_len={dist:fixed,value:8}",
    "replay=open_loop",
]
HOST = [
    "executor=host",
    "model=tiny",
    "kernel=torch",
    "cache.num_blocks=256",  # the default fills the KV budget: 131,072 blocks to build in every run
    "trace=synthetic",
    "trace.num_requests=8",
    "trace.prompt_len={dist:fixed,value:16}",
    "trace.output_len={dist:fixed,value:16}",
    "replay=closed_loop",
    "replay.concurrency=4",
]
SAME = "no significant difference"


def child_here(self, cmd: list[str], log) -> tuple[int, bool]:
    """Runner._child's contract (exit code, stopped) with the child's `python run.py ARGS` run here."""
    assert cmd[:2] == [sys.executable, str(ROOT / "run.py")], cmd
    return run_here(*cmd[2:], log=log), False


@pytest.fixture
def runs_here(monkeypatch):
    monkeypatch.setattr(Runner, "_child", child_here)


def order(out) -> list[tuple[str, str]]:
    return [(r["side"], r["run"]) for r in json.loads((out / "ab.json").read_text())["runs"]]


def test_the_order_is_balanced_for_a_linear_trend():
    slots = schedule(pairs=4, warmup=2)
    assert [(s.side, s.run) for s in slots] == [
        ("A", "warmup0"), ("B", "warmup0"), ("B", "warmup1"), ("A", "warmup1"),
        ("A", "repeat0"), ("B", "repeat0"), ("B", "repeat1"), ("A", "repeat1"),
        ("A", "repeat2"), ("B", "repeat2"), ("B", "repeat3"), ("A", "repeat3"),
    ]  # fmt: skip
    assert slots[0] == Slot("A", "warmup0", 0, None) and slots[-1] == Slot("A", "repeat3", 3, 3)
    # a drift linear in the slot number cancels in the pairs' differences, two pairs at a time
    measured = [(n, s) for n, s in enumerate(slots) if s.pair is not None]
    drift = sum(n if s.side == "A" else -n for n, s in measured)
    assert drift == 0


def test_identical_sides_on_the_simulator(tmp_path, capsys, runs_here):
    out = tmp_path / "ab"
    assert main(["--pairs", "2", "--warmup", "1", "--out", str(out), *SIM, "replay.warmup_runs=1"]) == 0
    printed = capsys.readouterr().out
    assert order(out) == [("A", "warmup0"), ("B", "warmup0"), ("A", "repeat0"), ("B", "repeat0"),
                          ("B", "repeat1"), ("A", "repeat1")]  # fmt: skip
    for side in ("A", "B"):  # a repeated run's folder: the warm-up kept apart, repeat i with repeat i's seeds
        table = pd.read_csv(out / side / "sweep.csv")
        assert sorted(table["run_dir"]) == ["repeat0", "repeat1"]
        assert sorted(table["seed"]) == [0, 1] and sorted(table["trace.seed"]) == [0, 1]  # the sim redraws
        assert (out / side / "warmup0" / "summary.json").exists() and (out / side / "sweep_ci.csv").exists()
        # replay.warmup_runs: a discarded run inside each run's process, before the measured one
        assert (out / side / "repeat1" / "warmup0" / "summary.json").exists()
        assert json.loads((out / side / "repeat1" / "warmup0" / "summary.json").read_text())["repeat"] == 1
    data = json.loads((out / "compare.json").read_text())
    assert data["design"] == "paired" and data["pairs"] == 2
    assert {m["verdict"] for m in data["metrics"]} == {SAME}, printed
    assert {m["detectable_pct"] for m in data["metrics"]} == {0.0}  # the simulator reproduces each pair
    assert "could have detected differences larger than 0.0%" in printed
    assert (out / "compare.txt").read_text().strip() == printed.strip()


def test_a_planted_ten_percent_is_found_at_five_interleaved_pairs(tmp_path, runs_here):
    out = tmp_path / "ab"
    rc = main(
        ["--a", "executor.step_time_s=0.02", "--b", "executor.step_time_s=0.022", "--pairs", "5", "--warmup", "0"]
        + ["--out", str(out), "--primary", "mean_tpot_ms", "--metric", "output_throughput", *HOST]
    )
    assert rc == 0
    data = json.loads((out / "compare.json").read_text())
    verdicts = {m["metric"]: m["verdict"] for m in data["metrics"]}
    assert verdicts == {"mean_tpot_ms": "A better", "output_throughput": "A better"}, data
    # the primary, declared before the first run, is recorded there and in the comparison
    assert json.loads((out / "ab.json").read_text())["primary"] == data["primary"] == "mean_tpot_ms"
    assert {m["metric"]: m["role"] for m in data["metrics"]}["mean_tpot_ms"] == "primary"
    assert data["design"] == "paired" and data["pairs"] == 5
    # the runs' own monotonic clock readings follow the recorded order, so the sides did interleave
    runs = [(s, r) for s, r in order(out)]
    assert runs[:4] == [("A", "repeat0"), ("B", "repeat0"), ("B", "repeat1"), ("A", "repeat1")]
    starts = [json.loads((out / s / r / "summary.json").read_text())["start_time"] for s, r in runs]
    assert starts == sorted(starts)
    assert not any("interleave" in n for n in data["notes"]), data["notes"]


def test_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "ab"
    assert main(["--out", str(out), "replay.repeats=3", *SIM]) == 2
    assert "replay.repeats: set by the runner" in capsys.readouterr().err
    assert main(["--out", str(out), "--b", "trace.rate=4", *SIM]) == 2
    assert "A and B differ in trace" in capsys.readouterr().err
    assert main(["--out", str(out), "--b", "scheduler.max_num_seqs=abc", *SIM]) == 2
    assert "max_num_seqs" in capsys.readouterr().err
    assert main(["--out", str(out), "--primary", "mean_tpt_ms", *SIM]) == 2
    assert "--primary mean_tpt_ms: no such metric; valid: mean_ttft_ms" in capsys.readouterr().err
    assert not out.exists()


def test_ctrl_c_keeps_the_finished_runs_and_compares_them(tmp_path):
    """SIGINT to the runner's process group (a terminal's Ctrl-C) while the third run goes: the run in
    flight writes what it measured (marked interrupted), the runner stops, and the finished pair is compared."""
    out = tmp_path / "ab"
    cmd = [sys.executable, "-m", "experiments.run.ab", "--pairs", "3", "--warmup", "0", "--out", str(out), *HOST]
    cmd += ["executor.step_time_s=0.05", "trace.num_requests=12"]  # 3 batches x 17 steps x 50 ms per run
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    log = out / "B" / "repeat1" / "run.log"  # the third run (B first in pair 2), once its replay has begun
    deadline = time.monotonic() + 600
    while not (log.exists() and "replaying" in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stderr
    runs = json.loads((out / "ab.json").read_text())["runs"]
    assert [(r["side"], r["run"], r["exit_code"]) for r in runs] == [
        ("A", "repeat0", 0), ("B", "repeat0", 0), ("B", "repeat1", 130)
    ], stderr  # fmt: skip
    assert json.loads((out / "B" / "repeat1" / "summary.json").read_text())["interrupted"] is True
    assert "1 run pair(s), paired" in stdout and (out / "compare.txt").exists()
