"""SIGTERM and SIGHUP stop a replay as Ctrl-C does: in-flight requests aborted, what was measured written
(summary.json "interrupted": true, the signal named, a sweep.csv row marked), exit status 128 + signal.
A real `python run.py` subprocess and a real signal."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from experiments.results.files import load_run, read_sweep

from ..runner.helpers import ROOT, assert_summary_matches

SYNTH = [
    "model=tiny",
    "cache.num_blocks=1024",
    "trace=synthetic",
    "trace.num_requests=2000",
    "trace.rate=20",
    "replay=open_loop",
    "trace.prompt_len={dist: uniform, low: 8, high: 48}",
    "trace.output_len={dist: uniform, low: 2, high: 8}",
]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: signal.Signals(s).name)
def test_stop_signal_keeps_measurements(tmp_path, sig):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), *SYNTH, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    # wait until a few requests have finished (the progress bar counts them), then send the signal
    deadline, seen = time.monotonic() + 300, ""
    while time.monotonic() < deadline and proc.poll() is None:
        seen += proc.stderr.read(1)
        done = re.findall(r"(\d+)/2000 \[", seen[-200:])
        if done and int(done[-1]) >= 3:
            break
    assert proc.poll() is None, seen[-3000:]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, (seen + err)[-3000:]
    assert f"interrupted ({signal.Signals(sig).name})" in err
    summary, requests, steps = load_run(run_dir)
    assert summary["interrupted"] is True and summary["signal"] == signal.Signals(sig).name
    assert 3 <= summary["completed"] < 2000 and len(steps) > 0
    assert set(requests["finish_reason"]) <= {"length", "abort"}
    assert summary["completed"] == (requests["finish_reason"] == "length").sum()
    assert_summary_matches(summary, requests)
    row = read_sweep(tmp_path, include_incomplete=True)
    assert len(row) == 1 and bool(row["interrupted"][0]) and row["signal"][0] == signal.Signals(sig).name
    assert read_sweep(tmp_path).empty  # the notebook's loader leaves the interrupted run out
